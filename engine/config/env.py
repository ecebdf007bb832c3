"""Config section of a multi-turn task: an environment the policy talks to (task.type =
"env"), the built-in calculator or the user's own class (engine.envs)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, ValidationInfo, model_validator

from engine.config._base import FieldError, _Section
from engine.config.reward import target_problem

BUILTIN_ENVS = {"calculator": "engine.envs.calculator:CalculatorEnv",
                "code_repair": "engine.envs.code_repair:CodeRepairEnv",
                "guess": "engine.envs.guess:GuessEnv"}
"""Environments the engine ships, by name: the class each is (imported only when used)."""


class EnvConfig(_Section):
    """Which environment, and the bounds every trajectory in it keeps."""

    # "class" is a Python keyword: the field is class_ and reads and writes as "class"
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True,
                              serialize_by_alias=True, validate_by_name=True)

    class_: str = Field(default="calculator", alias="class", min_length=3, max_length=1000)
    """The environment: a built-in name ("calculator": the model calls a calculator tool,
    then answers; "code_repair": the model rewrites a buggy program, the code sandbox runs
    it and answers with the first failing test; "guess": the model guesses a number, told
    up or down, over a long-tailed number of turns) or your own class,
    ``package.module:Class`` (importable on the workers) or ``path/to/file.py:Class``
    (relative paths as for task.path). The class is built
    with ``args`` as keywords, once per trajectory, and has draw(rng) -> row,
    reset(row) -> messages and step(text) -> StepResult (reset and step may be ``async
    def``); see engine/envs/base.py."""
    args: dict[str, int | float | bool | str] = Field(default_factory=dict)
    """Keyword arguments the environment class is built with."""
    max_turns: int = Field(default=4, ge=1, le=256)
    """Most model turns in one trajectory; one still going after its last turn is cut
    (not finished)."""
    max_tokens: int = Field(default=128, ge=2, le=131_072)
    """Token budget of one trajectory after its prompt: the model's turns and the
    observations together. A trajectory that reaches it is cut (not finished)."""
    step_timeout_s: float = Field(default=10.0, gt=0.0, le=3600.0)
    """Bound on one reset or step call. One that runs past it ends its trajectory
    (reason "env_timeout", counted in env/timeouts); its thread is left to finish."""
    workers: Literal["thread", "ray"] = "thread"
    """Where environment calls run. "thread": each on a thread of the rollout worker's
    process. "ray": on a small pool of Ray actors of its own (needs the run on Ray): a
    call ships the environment there pickled and brings it back with the state it left
    (a heavy or GIL-bound tool runs beside generation, not in its process)."""
    ray_actors: int = Field(default=2, ge=1, le=64)
    """With workers = "ray": the actors in each rollout worker's pool (num_cpus = 0; each
    runs many calls at once, on threads)."""

    reward_credit: Literal["trajectory", "turn"] = "trajectory"
    """Where a trajectory's step rewards are credited. "trajectory": their sum is its
    reward, at its end (GRPO's advantage; PPO's reward on its last sampled token).
    "turn": PPO's GAE gets each step's reward on the last token of the turn it answered
    (SkyRL's turn-level rewards; veRL's GAE passes over the observations between turns);
    the trajectory's reward is still their sum. GRPO's advantage is one per trajectory,
    so "turn" needs algorithm.type = "ppo"."""

    @model_validator(mode="after")
    def _class_named(self, info: ValidationInfo) -> EnvConfig:
        if self.class_ in BUILTIN_ENVS:
            return self
        if ":" not in self.class_:
            raise FieldError("task.env.class",
                             f"task.env.class={self.class_!r} is neither a built-in "
                             f"environment ({', '.join(BUILTIN_ENVS)}) nor "
                             '"package.module:Class" / "path/to/file.py:Class"; fix the name')
        problem = target_problem("task.env.class", self.class_, "Class",
                                 (info.context or {}).get("check_files", True))
        if problem is not None:
            raise FieldError("task.env.class", problem)
        return self


class EnvTaskConfig(_Section):
    """Multi-turn trajectories: the policy's turns interleave with an environment's
    observations (tool results), which are context for the next turn and never trained
    on; the trajectory's reward is the sum of its steps' rewards (task.env.reward_credit
    says where PPO credits them)."""

    type: Literal["env"] = "env"
    seed: int = Field(default=1234, ge=0, le=2**31 - 1)
    """Seed of the problem draws (the environment's draw): train stream and held-out split."""
    env: EnvConfig = EnvConfig()
    """The environment and its per-trajectory bounds."""
    eval_size: int = Field(default=64, ge=8, le=4096)
    """Held-out problems, drawn from the task seed and never used for training."""
