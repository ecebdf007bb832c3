"""Live controls (engine.controls) in the real loop on the tiny model: each is applied at a
step boundary and reported as a control.applied event at the step it takes effect from."""

import pytest

from engine.api import (
    CheckpointEvent,
    ControlAppliedEvent,
    ControlError,
    MetricsEvent,
    RunStatusEvent,
    validate_control,
)
from engine.controls import (
    CheckpointControl,
    PauseControl,
    ResumeControl,
    SetEvalEveryControl,
    SetLrControl,
)
from engine.orchestration.loop import RunLoop
from engine.telemetry.sinks import MemorySink

from .conftest import small_run


def step_metrics(events) -> list[MetricsEvent]:
    return [e for e in events if isinstance(e, MetricsEvent) and "reward/mean" in e.values]


class Operator:
    """Hands the loop controls at chosen step boundaries, resumes a pause after a few
    polls, and asks for a stop while the second pause holds; records what it saw while
    the loop held."""

    def __init__(self, sink: MemorySink):
        self.sink = sink
        self.loop: RunLoop | None = None  # the loop it operates, once made
        self.plan = {
            1: [SetLrControl(id=1, value=5e-4, requested_by="olga"),
                CheckpointControl(id=2, requested_by="olga"),
                SetEvalEveryControl(id=3, value=1, requested_by="olga")],
            2: [PauseControl(id=4, requested_by="olga")],
            3: [PauseControl(id=6, requested_by="olga")],
        }
        self.held: list[tuple[int, int]] = []   # (loop step, steps reported) per held poll
        self.stop = False

    def take(self):
        controls = self.loop.controls
        step = controls.boundary          # the loop's step, which the controls apply before
        if controls.paused:
            self.held.append((step, len(step_metrics(self.sink.events))))
            polls_in_this_hold = sum(1 for s, _ in self.held if s == step)
            if step == 2 and polls_in_this_hold == 3:
                return [ResumeControl(id=5, requested_by="vic")]
            if step == 3 and polls_in_this_hold == 2:
                self.stop = True
            return []
        return self.plan.pop(step, [])


@pytest.fixture(scope="module")
def controlled_run(tmp_path_factory, model_cache):
    out = tmp_path_factory.mktemp("controlled")
    sink = MemorySink()
    operator = Operator(sink)
    operator.loop = RunLoop(small_run(steps=6), out, sink=sink, take_controls=operator.take,
                            stop_requested=lambda: operator.stop)
    summary = operator.loop.run()
    return summary, sink.events, operator, out


@pytest.mark.slow  # one real 3-step run on the tiny model, shared
def test_each_control_is_reported_applied_in_order_at_the_step_it_takes_effect(
        controlled_run):
    _, events, _, _ = controlled_run
    applied = [e for e in events if isinstance(e, ControlAppliedEvent)]

    assert [(e.control_id, e.kind, e.step) for e in applied] == [
        (1, "set_lr", 1), (2, "checkpoint", 1), (3, "set_eval_every", 1),
        (4, "pause", 2), (5, "resume", 2), (6, "pause", 3)]
    assert applied[0].value == 5e-4 and applied[2].value == 1.0
    assert applied[0].message == "learning rate 0.001 -> 0.0005 from step 1 (by olga)"
    assert applied[4].requested_by == "vic" and "(by vic)" in applied[4].message


@pytest.mark.slow  # one real 3-step run on the tiny model, shared
def test_a_new_learning_rate_shows_in_the_next_steps_metrics(controlled_run):
    _, events, _, _ = controlled_run
    lr = {e.step: e.values["learner/lr"] for e in step_metrics(events)}

    assert lr == {0: 1e-3, 1: 5e-4, 2: 5e-4}


@pytest.mark.slow  # one real 3-step run on the tiny model, shared
def test_checkpoint_now_writes_a_checkpoint_at_that_step(controlled_run):
    _, events, _, out = controlled_run
    saved = [e for e in events if isinstance(e, CheckpointEvent)]
    applied_at = next(e.seq for e in events if isinstance(e, ControlAppliedEvent)
                      and e.kind == "checkpoint")

    assert saved[0].step == 1 and saved[0].seq < applied_at  # written, then reported
    assert (out / "checkpoints" / "step_000001" / "state.json").exists()


@pytest.mark.slow  # one real 3-step run on the tiny model, shared
def test_a_new_eval_cadence_runs_the_held_out_eval_from_then_on(controlled_run):
    _, events, _, _ = controlled_run
    evals = [e.step for e in events if isinstance(e, MetricsEvent)
             and "eval/reward_mean" in e.values]

    # before the run, then every step from step 1 on (the config had none mid-run),
    # and after the run (the stop's end)
    assert evals == [0, 2, 3, 3]


@pytest.mark.slow  # one real 3-step run on the tiny model, shared
def test_a_pause_holds_the_step_count_still_until_resume_and_a_stop_ends_it(controlled_run):
    summary, events, operator, _ = controlled_run

    first_hold = [h for h in operator.held if h[0] == 2]
    assert len(first_hold) == 3 and {n for _, n in first_hold} == {2}  # no step while held
    assert [e.step for e in step_metrics(events)] == [0, 1, 2]         # then it went on
    second_hold = [h for h in operator.held if h[0] == 3]
    assert second_hold and {n for _, n in second_hold} == {3}
    assert summary.status == "stopped" and summary.steps_done == 3      # stop while paused
    assert [e.status for e in events if isinstance(e, RunStatusEvent)][-1] == "stopped"
    assert [e.step for e in events if isinstance(e, CheckpointEvent)] == [1, 3]


@pytest.mark.parametrize("data,field,words", [
    ({"kind": "set_lr", "value": 0}, "value", "greater than 0"),
    ({"kind": "set_lr", "value": float("nan")}, "value", "finite"),
    ({"kind": "set_lr", "value": 2.0}, "value", "less than or equal to 1"),
    ({"kind": "set_lr"}, "value", "required"),
    ({"kind": "set_eval_every", "value": 2.5}, "value", "integer"),
    ({"kind": "set_eval_every", "value": -1}, "value", "greater than or equal to 0"),
    ({"kind": "pause", "value": 3}, "value", "remove it"),
    ({"kind": "rewind"}, "kind", "must be one of checkpoint, pause, resume"),
])
def test_a_bad_control_names_the_field_and_what_it_should_be(data, field, words):
    with pytest.raises(ControlError) as caught:
        validate_control(data)

    [(got_field, message)] = caught.value.errors
    assert got_field == field and words in message


def test_a_good_control_keeps_its_id_and_who_asked():
    control = validate_control({"kind": "set_eval_every", "value": "10", "id": 7,
                                "requested_by": "olga"})

    assert control == SetEvalEveryControl(id=7, value=10, requested_by="olga")
