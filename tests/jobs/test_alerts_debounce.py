"""Alert rules after ingest, as deployments run them (RLPLANE_ALERT_DEBOUNCE_S > 0): out
of the ingest transaction, one queued evaluation per run however many batches arrive,
and the next batch after an evaluation started queues the next one."""

import uuid

import pytest

from jobs.alerts import debounce
from jobs.ingest.store import do_ingest_events
from jobs.models import Alert

from .test_alerts import sync


@pytest.fixture
def queued(settings, monkeypatch):
    """Evaluations queued for the worker (the Celery seam), as (run id, options); the
    due keys under a prefix of this test's own on the real Redis."""
    settings.RLPLANE_ALERT_DEBOUNCE_S = 1.0
    monkeypatch.setattr(debounce, "DUE_KEY", f"test-{uuid.uuid4().hex}:{{}}")
    calls = []
    monkeypatch.setattr(debounce.evaluate_run_alerts, "apply_async",
                        lambda args, **options: calls.append((*args, options)))
    return calls


def test_batches_in_a_burst_queue_one_evaluation_which_sees_them_all(
        run, channel_layer, queued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        do_ingest_events(run, [sync(1, 0)])
        do_ingest_events(run, [sync(2, 1, rollout_fp="fp1")])
        do_ingest_events(run, [sync(3, 2, rollout_fp="fp1")])
    assert queued == [(run.pk, {})]            # at once: no ETA held unacknowledged
    assert not Alert.objects.filter(run=run).exists()      # not in the ingest call

    debounce.evaluate_run_alerts(run.pk)                     # what the worker runs
    alert = Alert.objects.get(run=run)
    assert alert.kind == "WeightSyncDesync" and alert.evidence["values"]["version_learner"] == 3

    with django_capture_on_commit_callbacks(execute=True):
        do_ingest_events(run, [sync(4, 3)])                  # after it started: queued anew
        do_ingest_events(run, [sync(2, 1)])                  # a replay, nothing new: none
    assert queued == [(run.pk, {}), (run.pk, {})]


def test_nothing_is_queued_before_the_batch_commits(run, channel_layer, queued,
                                                     django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        do_ingest_events(run, [sync(1, 0)])
    assert queued == [] and callbacks
