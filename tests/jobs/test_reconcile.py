"""What a driver wrote to its run directory while the control plane was away reaches the
database once: events, checkpoints (listed, forkable) and its final status."""

import json

import pytest
from django.conf import settings

from jobs.ingest.store import do_ingest_events
from jobs.models import Checkpoint, RunEvent, RunStatus
from jobs.runs.reconcile import do_mark_runs_lost_with_ray_head, do_reconcile_run, nothing_new

from .helpers import checkpoint, metrics, status


def write_run_dir(run, events, spool=(), state_steps=()):
    """The driver's files: events.jsonl, ingest-spool.jsonl, finished checkpoints."""
    d = settings.RLPLANE_RUNS_DIR / f"run-{run.pk}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "events.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n" for e in events)
                                    + '{"type": "metrics.append", "seq": 9')  # a torn line
    (d / "ingest-spool.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n"
                                                  for e in spool))
    for step in state_steps:
        c = d / "checkpoints" / f"step_{step:06d}"
        c.mkdir(parents=True)
        (c / "state.json").write_text(json.dumps({"step": step, "version": step,
                                                  "fingerprint": f"fp{step}"}))


@pytest.mark.django_db
def test_what_the_driver_wrote_while_the_control_plane_was_down_is_ingested_once(
        make_run, operator):
    run = make_run(RunStatus.RUNNING)
    delivered = [status(1, "running"), metrics(2, 1, **{"reward/mean": 0.1})]
    do_ingest_events(run, delivered)
    missed = [metrics(3, 2, **{"reward/mean": 0.2}), checkpoint(4, 2),
              status(5, "succeeded", "done")]
    # step 3's checkpoint finished on disk, but its event never made it anywhere
    write_run_dir(run, delivered + missed, spool=missed[1:], state_steps=(2, 3))

    first = do_reconcile_run(run)
    again = do_reconcile_run(run)

    assert (first.events, first.checkpoints, first.skipped) == (3, 1, 1)
    assert (again.events, again.checkpoints) == (0, 0)
    assert list(RunEvent.objects.filter(run=run).values_list("seq", flat=True)) == [1, 2, 3,
                                                                                    4, 5]
    assert [c.step for c in Checkpoint.forkable(run)] == [3, 2]
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert operator.get(f"/runs/{run.pk}/fork").status_code == 200


@pytest.mark.django_db
def test_a_dead_ray_head_marks_its_runs_lost_with_the_cause_unless_they_had_finished(
        make_run):
    cut_off = make_run(RunStatus.RUNNING, ray_submission_id="rlplane-run-a")
    finished = make_run(RunStatus.RUNNING, ray_submission_id="rlplane-run-b")
    write_run_dir(cut_off, [status(1, "running"), checkpoint(2, 1)], state_steps=(1,))
    write_run_dir(finished, [status(1, "running"), status(2, "succeeded")])

    do_mark_runs_lost_with_ray_head("2026-12-03T05:00:00+00:00", "killed by signal 9")

    cut_off.refresh_from_db()
    finished.refresh_from_db()
    assert cut_off.status == RunStatus.LOST
    assert cut_off.status_reason.startswith(
        "the Ray head died at 2026-12-03T05:00:00+00:00 (killed by signal 9)")
    assert [c.step for c in Checkpoint.forkable(cut_off)] == [1]
    assert finished.status == RunStatus.SUCCEEDED


def test_a_run_directory_whose_last_event_is_stored_is_not_read_again(tmp_path):
    (tmp_path / "events.jsonl").write_text(
        "".join(json.dumps(e.to_dict()) + "\n" for e in (status(1, "running"),
                                                         metrics(2, 1)))
        + '{"type": "log", "seq": 3')              # torn: the driver died mid-line

    assert nothing_new(tmp_path, highest_seq=2)
    assert not nothing_new(tmp_path, highest_seq=1)
    (tmp_path / "ingest-spool.jsonl").write_text("")  # undelivered events: always read
    assert not nothing_new(tmp_path, highest_seq=2)
