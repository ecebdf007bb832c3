"""The operator's world as tables, one topic per module:

    preset.py   Preset        a named, validated RunConfig
    run.py      Run           one run: config, status machine, ingest token
    status.py   RunStatus     the run's states, the transitions between them, LIVE, TERMINAL
    series.py   MetricPoint   per-step metric values; MetricRollup: their bucketed tiers;
                PhaseSpan: device busy intervals
    events.py   RunEvent      every engine event, unique by (run, seq); Checkpoint
    alerts.py   Alert         a named condition on a run; AlertChannel; Notification
    tokens.py   ApiToken      a user's REST API token, stored hashed
    controls.py RunControl    a live control asked of a running run (pause, set_lr, ...)
    samples.py  InspectedSample  a rollout of a step, for the inspector (bounded retention)
"""

from jobs.models.alerts import (
    LIVE_STATES,
    Alert,
    AlertChannel,
    AlertState,
    Notification,
    NotificationStatus,
)
from jobs.models.controls import RunControl
from jobs.models.events import Checkpoint, RunEvent
from jobs.models.preset import Preset
from jobs.models.run import NotNative, Run
from jobs.models.samples import InspectedSample
from jobs.models.series import (
    MetricPoint,
    MetricRollup,
    PhaseSpan,
    last_points,
    last_steps,
    latest_values,
    step_bounds,
    stored_metric_names,
)
from jobs.models.status import LIVE, TERMINAL, TRANSITIONS, InvalidTransition, RunStatus
from jobs.models.tokens import ApiToken

__all__ = [
    "LIVE_STATES", "Alert", "AlertChannel", "AlertState", "ApiToken", "Notification",
    "InspectedSample", "NotificationStatus",
    "LIVE", "TERMINAL", "TRANSITIONS", "Checkpoint", "InvalidTransition", "MetricPoint",
    "MetricRollup",
    "NotNative", "PhaseSpan", "Preset", "Run", "RunControl", "RunEvent", "RunStatus",
    "last_points", "last_steps", "latest_values", "step_bounds", "stored_metric_names",
]
