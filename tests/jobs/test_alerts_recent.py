"""The history the alert rules read, kept per run and extended by what arrived since the
last evaluation (jobs/alerts/recent.py): it must be what a fresh read gives."""

import pytest
from django.db import transaction

from jobs.alerts import recent
from jobs.ingest.store import do_ingest_events
from jobs.models import Run

from .helpers import metrics, span


def step(seq, n):
    return [span(seq, n), metrics(seq + 1, n, **{"reward/mean": float(n)})]


@pytest.fixture
def ingest(django_capture_on_commit_callbacks):
    """A batch stored and committed, and the rules evaluated after it, their commit
    included (the cache keeps what committed): RLPLANE_ALERT_DEBOUNCE_S = 0 here."""
    def ingest(run, events):
        with django_capture_on_commit_callbacks(execute=True):
            do_ingest_events(run, events)
    return ingest


def cached(run):
    return recent._cache[run.pk].history


def fresh(run):
    return recent.read(Run.objects.get(pk=run.pk)).history


def same(a, b):
    assert a.metrics == b.metrics
    assert [s.seq for s in a.spans] == [s.seq for s in b.spans]
    assert a.steps == b.steps


def test_a_later_evaluation_reads_only_what_arrived_and_sees_what_a_fresh_read_sees(
        run, channel_layer, ingest):
    ingest(run, step(1, 0) + step(3, 1))
    first = cached(run)
    ingest(run, step(5, 2))
    assert cached(run) is first                 # extended, not read again
    assert recent._cache[run.pk].events == 6 and recent._cache[run.pk].top == 6
    same(cached(run), fresh(run))


def test_an_event_stored_out_of_order_has_the_history_read_again(
        run, channel_layer, ingest):
    ingest(run, step(1, 0) + step(5, 2))       # seqs 3-4 (step 1) held back
    ingest(run, step(3, 1))                    # below the highest seq read
    run.refresh_from_db()
    assert run.history_rewrites == 1
    assert cached(run).steps == [0, 1, 2]
    same(cached(run), fresh(run))


def test_a_rolled_back_evaluation_leaves_nothing_cached(
        run, channel_layer, ingest):
    ingest(run, step(1, 0))
    ingest(run, step(3, 1))
    with transaction.atomic():
        recent.recent_history(Run.objects.get(pk=run.pk))
        transaction.set_rollback(True)
    assert run.pk not in recent._cache


def test_the_window_is_read_again_past_its_slack(
        run, channel_layer, ingest, monkeypatch):
    monkeypatch.setattr(recent, "HISTORY_LIMIT", 4)
    monkeypatch.setattr(recent, "SLACK", 2)
    ingest(run, [e for n in range(3) for e in step(1 + 2 * n, n)])
    assert cached(run).steps == [1, 2]                   # the last 4 events
    ingest(run, step(7, 3))
    assert cached(run).steps == [1, 2, 3]                # 6: extended up to 4 + 2
    ingest(run, step(9, 4))
    assert cached(run).steps == [3, 4]                   # 6 + 2: read again, the last 4


def test_the_cache_keeps_the_most_recently_evaluated_runs_within_its_events(
        make_run, channel_layer, ingest, monkeypatch):
    monkeypatch.setattr(recent, "CACHE_EVENTS", 4)
    runs = [make_run() for _ in range(3)]
    for r in runs:
        ingest(r, step(1, 0))
    assert list(recent._cache) == [runs[1].pk, runs[2].pk]
