"""RunConfig: the one typed, validated description of an RL run.

Every section is a pydantic model with ``extra="forbid"``, bounded fields and a docstring
per field. Pluggable parts (task, rollout, placement, async policy, weight sync, reward)
are discriminated unions keyed on ``type``: adding a choice is adding a union member, not
reshaping the config.

This package imports neither torch nor ray: the web process validates configs with it.

    cfg = load_config("configs/demo_arithmetic.toml")   # ConfigError names field + fix
    text = dump_config(cfg)                             # TOML, round-trips

One module per section: ``model_task`` (model, task, warm start; ``datafile`` reads a
dataset file's shape for it; ``env`` a multi-turn task's environment), ``algorithm``
(the RL objective), ``rollout``, ``placement``, ``async_policy``, ``weightsync``,
``reward``, ``faults``; ``run`` holds
RunConfig and its cross-section checks, ``errors`` ConfigError and TOML load/dump, and
``_base`` the shared section base; ``learner`` is how the learner computes (device,
precision, packing). Import from ``engine.config`` itself: every public name is
re-exported here.
"""

from __future__ import annotations

from engine.config.algorithm import (
    AdvEstimator,
    AlgorithmConfig,
    CriticConfig,
    GrpoConfig,
    LossAggMode,
    NoOverlongConfig,
    OverlongConfig,
    OverlongFilterConfig,
    OverlongPenaltyConfig,
    PpoConfig,
)
from engine.config.async_policy import (
    AsyncPolicyConfig,
    FullyAsyncPolicyConfig,
    OneStepOffPolicyConfig,
    PartialRolloutPolicyConfig,
    SyncPolicyConfig,
)
from engine.config.env import BUILTIN_ENVS, EnvConfig, EnvTaskConfig
from engine.config.errors import (
    ConfigError,
    dump_config,
    load_config,
    loads_config,
    union_choices,
    validate_config,
)
from engine.config.external import (
    FRAMEWORK_LABELS,
    FRAMEWORKS,
    NATIVE,
    ExternalRunConfig,
    LaunchConfig,
    is_external,
    validate_external,
)
from engine.config.faults import (
    EntropyCollapseFault,
    EnvErrorFault,
    FaultsConfig,
    ImportanceCollapseFault,
    KillRolloutWorkerFault,
    NoStopFault,
    SkipOnResumeFault,
    SkipWeightSyncFault,
    SleepDropsWeightsFault,
    SlowEnvFault,
    SlowRewardFault,
    StalenessOverrunFault,
    StragglerFault,
    SyncHangFault,
    UnscaledLogprobsFault,
    VersionResetFault,
)
from engine.config.learner import LearnerConfig
from engine.config.model_task import (
    ArithmeticTaskConfig,
    CodeTaskConfig,
    DatasetTaskConfig,
    LongTailTaskConfig,
    ModelConfig,
    ModelSize,
    TaskConfig,
    WarmStartConfig,
)
from engine.config.placement import (
    BundleStrategy,
    ColocatedPlacementConfig,
    DisaggregatedPlacementConfig,
    PlacementConfig,
)
from engine.config.placement import _PlacementCommon as _PlacementCommon
from engine.config.reward import (
    MathRewardConfig,
    PythonRewardConfig,
    RewardConfig,
    RewardModelConfig,
    RuleRewardConfig,
    SandboxRewardConfig,
)
from engine.config.reward import _RewardPool as _RewardPool
from engine.config.rollout import RolloutConfig, TorchRolloutConfig, VllmRolloutConfig
from engine.config.rollout import _RolloutCommon as _RolloutCommon
from engine.config.run import (
    CheckpointConfig,
    RunConfig,
    TelemetryConfig,
    fork_name,
    longest_answer,
)
from engine.config.weightsync import (
    BroadcastSyncConfig,
    CheckpointFileSyncConfig,
    CudaIpcSyncConfig,
    InPlaceSyncConfig,
    ObjectStoreSyncConfig,
    ShmSyncConfig,
    VllmNativeSyncConfig,
    WeightSyncConfig,
)

__all__ = [
    "FRAMEWORK_LABELS",
    "FRAMEWORKS",
    "NATIVE",
    "ExternalRunConfig",
    "LaunchConfig",
    "is_external",
    "validate_external",
    "AdvEstimator",
    "BUILTIN_ENVS",
    "EnvConfig",
    "EnvTaskConfig",
    "AlgorithmConfig",
    "ArithmeticTaskConfig",
    "AsyncPolicyConfig",
    "BroadcastSyncConfig",
    "BundleStrategy",
    "CheckpointConfig",
    "CheckpointFileSyncConfig",
    "CodeTaskConfig",
    "ColocatedPlacementConfig",
    "ConfigError",
    "CriticConfig",
    "CudaIpcSyncConfig",
    "DatasetTaskConfig",
    "DisaggregatedPlacementConfig",
    "EntropyCollapseFault",
    "EnvErrorFault",
    "FaultsConfig",
    "FullyAsyncPolicyConfig",
    "GrpoConfig",
    "ImportanceCollapseFault",
    "InPlaceSyncConfig",
    "LearnerConfig",
    "LongTailTaskConfig",
    "LossAggMode",
    "MathRewardConfig",
    "ModelConfig",
    "ModelSize",
    "NoOverlongConfig",
    "NoStopFault",
    "ObjectStoreSyncConfig",
    "OneStepOffPolicyConfig",
    "OverlongConfig",
    "OverlongFilterConfig",
    "OverlongPenaltyConfig",
    "PartialRolloutPolicyConfig",
    "PlacementConfig",
    "PpoConfig",
    "PythonRewardConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RuleRewardConfig",
    "RunConfig",
    "SandboxRewardConfig",
    "ShmSyncConfig",
    "KillRolloutWorkerFault",
    "SkipOnResumeFault",
    "SkipWeightSyncFault",
    "SleepDropsWeightsFault",
    "SlowEnvFault",
    "SlowRewardFault",
    "StalenessOverrunFault",
    "StragglerFault",
    "SyncHangFault",
    "SyncPolicyConfig",
    "TaskConfig",
    "TelemetryConfig",
    "TorchRolloutConfig",
    "UnscaledLogprobsFault",
    "VersionResetFault",
    "VllmNativeSyncConfig",
    "VllmRolloutConfig",
    "WarmStartConfig",
    "WeightSyncConfig",
    "dump_config",
    "fork_name",
    "load_config",
    "loads_config",
    "longest_answer",
    "union_choices",
    "validate_config",
]
