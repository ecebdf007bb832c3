import pytest

from engine.telemetry.spans import Span, phase_metrics, union_length


def test_union_length_merges_overlaps_and_clips_to_the_window():
    assert union_length([(0, 2), (1, 3), (5, 6)], 0, 10) == 4
    assert union_length([(-5, 1), (9, 20)], 0, 10) == 2


def test_bubble_and_rollout_share_on_a_hand_made_step():
    # Disaggregated picture over a 10 s step on two devices:
    #   gpu:0  rollout 0-6                    (idle 6-10)
    #   gpu:1           reward 6-7  learner 7-9  sync 9-10  (idle 0-6)
    spans = [
        Span("gpu:0", "rollout", 0, 6),
        Span("gpu:1", "reward", 6, 7),
        Span("gpu:1", "learner", 7, 9),
        Span("gpu:0", "weight_sync", 9, 10),
        Span("gpu:1", "weight_sync", 9, 10),
    ]
    m = phase_metrics(spans, ["gpu:0", "gpu:1"], 0.0, 10.0)
    assert m["time/step_s"] == 10
    assert m["rollout_share"] == pytest.approx(0.6)
    # busy: gpu:0 = 6 + 1 = 7, gpu:1 = 1 + 2 + 1 = 4  -> 1 - 11/20
    assert m["bubble"] == pytest.approx(0.45)
    assert m["device/utilization/gpu:0"] == pytest.approx(0.7)
    assert m["device/utilization/gpu:1"] == pytest.approx(0.4)
    assert m["time/idle_s"] == pytest.approx((3 + 6) / 2)
    assert m["time/learner_s"] == pytest.approx(2)
    assert m["time/weight_sync_s"] == pytest.approx(1)


def test_a_fully_busy_colocated_step_has_no_bubble():
    spans = [Span("cpu:0", "rollout", 0, 4), Span("cpu:0", "learner", 4, 10)]
    m = phase_metrics(spans, ["cpu:0"], 0, 10)
    assert m["bubble"] == pytest.approx(0.0)
    assert m["rollout_share"] == pytest.approx(0.4)


def test_an_empty_window_is_an_error():
    with pytest.raises(ValueError):
        phase_metrics([], ["cpu:0"], 5, 5)
