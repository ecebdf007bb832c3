"""ExternalRunConfig: a run rlplane watches but does not train, because another framework
(TRL, veRL, OpenRLHF, prime-rl, any script) does.

It is not a RunConfig: nothing in it says how to place, generate or learn. It names the
run and its framework, keeps the user's own parameters as they are (shown on the run page,
compared between runs), and optionally says how to launch the training command as a Ray
Job (``launch``). Without ``launch`` the user's process is already running somewhere and
reports through ``rlplane.track``, an adapter, a tailed file or the MLflow endpoint.

A stored run config is an external one exactly when it has a ``framework`` key other than
"rlplane" (RunConfig has no such key), so one JSON column holds both kinds.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from engine.config._base import _Section

FRAMEWORKS = ("trl", "verl", "openrlhf", "prime-rl", "script")
"""The frameworks an external run may name; "script" is anything else that reports."""
FRAMEWORK_LABELS = {"trl": "TRL", "verl": "veRL", "openrlhf": "OpenRLHF",
                    "prime-rl": "prime-rl", "script": "script", "rlplane": "rlplane"}
"""How pages and the CLI write each framework's name."""
NATIVE = "rlplane"
"""The framework of a run of rlplane's own engine (its config is a RunConfig)."""
INJECTED_ENV = ("RLPLANE_URL", "RLPLANE_RUN_ID", "RLPLANE_TOKEN", "MLFLOW_TRACKING_URI",
                "MLFLOW_TRACKING_TOKEN")
"""What rlplane sets in a launched command's environment (a launch may not set them)."""
PARAMS_BYTES = 64 * 1024
"""Bound on the JSON size of an external run's free-form parameters."""

Framework = Literal["trl", "verl", "openrlhf", "prime-rl", "script"]


class LaunchConfig(_Section):
    """How the control plane starts the training command: a Ray Job through the queue."""

    entrypoint: str = Field(min_length=1, max_length=4096)
    """The shell command the Ray Job runs, e.g. "python train.py --lr 1e-6" or
    "python -m verl.trainer.main_ppo ..."."""
    working_dir: str | None = Field(default=None, max_length=4096)
    """Directory the command runs in (uploaded by Ray as the job's working_dir); None: the
    Ray job's default."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for the command (Ray runtime_env env_vars). RLPLANE_URL,
    RLPLANE_RUN_ID, RLPLANE_TOKEN and MLFLOW_TRACKING_URI/TOKEN are injected by rlplane."""
    pip: list[str] = Field(default_factory=list, max_length=64)
    """Packages Ray installs for the job (runtime_env pip); empty: the cluster's Python."""
    gpus: int = Field(default=0, ge=0, le=1024)
    """GPUs the command needs (counted by the queue, reserved for the Ray job)."""
    cpus: float = Field(default=1.0, gt=0.0, le=4096)
    """CPUs the command needs (counted by the queue, reserved for the Ray job)."""

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not name or not name.replace("_", "a").isalnum() or name[0].isdigit():
                raise ValueError(f"{name!r} is not an environment variable name; use "
                                 "letters, digits and '_', not starting with a digit")
            if name in INJECTED_ENV:
                raise ValueError(f"{name} is set by rlplane for the run; remove it")
        return env


class ExternalRunConfig(_Section):
    """A run another framework trains and rlplane watches."""

    name: str = Field(default="run", min_length=1, max_length=100,
                      pattern=r"^[A-Za-z0-9_.\-]+$")
    """Run name: letters, digits, '_', '.', '-'."""
    framework: Framework
    """Which framework trains it: "trl", "verl", "openrlhf", "prime-rl" or "script". Its
    metric names are mapped to rlplane's (engine.frameworks); unmapped names are kept."""
    params: dict[str, Any] = Field(default_factory=dict)
    """The run's own parameters, free-form (shown on the run page and in compare)."""
    launch: LaunchConfig | None = None
    """Start the training command as a Ray Job; None: the process runs elsewhere and
    reports by itself."""

    @field_validator("params")
    @classmethod
    def _params_bounded(cls, params: dict[str, Any]) -> dict[str, Any]:
        try:
            size = len(json.dumps(params, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"params must be plain JSON values ({exc})") from None
        if size > PARAMS_BYTES:
            raise ValueError(f"params are {size} bytes of JSON; keep them under "
                             f"{PARAMS_BYTES} (log long values as artifacts of the run)")
        return params


def is_external(data: Any) -> bool:
    """Whether a stored or submitted config describes an external run."""
    return isinstance(data, dict) and data.get("framework", NATIVE) != NATIVE


def validate_external(data: dict[str, Any]) -> ExternalRunConfig:
    """Validate an external run's config, or raise ConfigError naming each bad field."""
    from engine.config.errors import ConfigError  # errors imports run, which is heavier

    try:
        return ExternalRunConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            path = ".".join(str(x) for x in err["loc"]) or "(root)"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                owner = LaunchConfig if err["loc"][:1] == ("launch",) else ExternalRunConfig
                msg = f"unknown key; allowed keys here: {', '.join(sorted(owner.model_fields))}"
            elif err["type"] == "literal_error" and err["loc"] == ("framework",):
                msg = (f"unknown framework {err.get('input')!r}; use one of "
                       f"{', '.join(FRAMEWORKS)} (a run of rlplane's own engine has no "
                       "framework key)")
            problems.append((path, msg))
        raise ConfigError(problems) from None
