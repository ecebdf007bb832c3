import json

import pytest

from engine.api import (
    CheckpointEvent,
    LogEvent,
    MetricsEvent,
    RunStatusEvent,
    SpanEvent,
    WeightSyncEvent,
    event_from_dict,
    validate,
)
from engine.config import ConfigError


@pytest.mark.parametrize("event", [
    RunStatusEvent(seq=1, ts=1.5, status="running"),
    MetricsEvent(seq=2, ts=2.0, step=3, values={"reward/mean": 0.5, "bubble": 0.1}),
    SpanEvent(seq=3, ts=2.5, device="cpu:0", phase="rollout", start=1.0, end=2.0, step=3),
    WeightSyncEvent(seq=4, ts=3.0, step=3, transport="in_place", version_learner=4,
                    version_rollout=4, fingerprint_learner="ab", fingerprint_rollout="ab"),
    LogEvent(seq=5, ts=3.5, level="error", message="boom"),
    CheckpointEvent(seq=6, ts=4.0, step=3, version=3, path="/r/checkpoints/step_000003"),
])
def test_events_round_trip_through_json(event):
    data = json.loads(json.dumps(event.to_dict()))
    assert data["type"] == event.type
    assert event_from_dict(data) == event


def test_validate_returns_a_config_or_names_the_bad_field():
    assert validate({"steps": 5}).steps == 5
    with pytest.raises(ConfigError) as exc:
        validate({"algorithm": {"clip_eps": -1}})
    assert exc.value.errors[0][0] == "algorithm.clip_eps"
