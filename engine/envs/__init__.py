"""Environments of multi-turn tasks (task.type = "env"): the seam (engine.envs.base), the
built-in ones, and how a config's task.env.class becomes a class.

    cls = env_class(cfg.task.env)          built-in name -> its class (lazily imported),
                                           else the user's "module:Class" / "file.py:Class"
    env = cls(**cfg.task.env.args)         one per trajectory
"""

from __future__ import annotations

import importlib

from engine.config import BUILTIN_ENVS, EnvConfig


def env_class(cfg: EnvConfig) -> type:
    """The class task.env.class names; ConfigError (task.env.class) when it cannot be
    loaded, as for reward.function (the same loader, the same refusals)."""
    if cfg.class_ in BUILTIN_ENVS:
        module, _, name = BUILTIN_ENVS[cfg.class_].partition(":")
        return getattr(importlib.import_module(module), name)
    from engine.reward.user_function import load_function

    return load_function(cfg.class_, field="task.env.class", what="a class")
