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


def test_the_window_moves_on_past_its_slack(
        run, channel_layer, ingest, monkeypatch):
    monkeypatch.setattr(recent, "HISTORY_LIMIT", 4)
    monkeypatch.setattr(recent, "SLACK", 2)
    ingest(run, [e for n in range(3) for e in step(1 + 2 * n, n)])
    assert cached(run).steps == [1, 2]                   # the last 4 events
    ingest(run, step(7, 3))
    assert cached(run).steps == [1, 2, 3]                # 6: extended up to 4 + 2
    ingest(run, step(9, 4))
    assert cached(run).steps == [3, 4]                   # 6 + 2: the last 4 kept


def test_the_cache_keeps_the_most_recently_evaluated_runs_within_its_events(
        make_run, channel_layer, ingest, monkeypatch):
    monkeypatch.setattr(recent, "CACHE_EVENTS", 4)
    runs = [make_run() for _ in range(3)]
    for r in runs:
        ingest(r, step(1, 0))
    assert list(recent._cache) == [runs[1].pk, runs[2].pk]


def test_the_window_kept_past_its_slack_is_what_a_fresh_read_of_it_gives(
        run, channel_layer, ingest, monkeypatch):
    """Kept in place (RunHistory.keep_last), never read again: equal to a fresh read of
    the events it holds in everything the rules read, over a stream with NaN
    values, a step's eval metrics after its training ones (one name given twice), spans
    ending out of order and syncs."""
    import random

    from engine.api import SpanEvent, WeightSyncEvent
    from jobs.alerts.history import HISTORY_EVENTS, RunHistory
    from jobs.models import RunEvent

    monkeypatch.setattr(recent, "HISTORY_LIMIT", 12)
    monkeypatch.setattr(recent, "SLACK", 6)
    rng = random.Random(7)
    seq, n, reads, previous, trimmed = 1, 0, [], 0, False
    monkeypatch.setattr(recent, "read", lambda r, read=recent.read: reads.append(1) or read(r))
    for _ in range(40):
        events = []
        for _ in range(rng.randint(1, 4)):
            events.append(SpanEvent(seq=seq, ts=1000.0 + rng.random(), device="cpu:0",
                                    phase="rollout", start=0.0, end=rng.random(), step=n))
            events.append(metrics(seq + 1, n, **{"reward/mean": rng.choice([float(n), None]),
                                                 "loss": float(n)}))
            events.append(metrics(seq + 2, n, **{"eval/reward_mean": float(-n),
                                                 "loss": rng.choice([None, 7.0])}))
            events.append(WeightSyncEvent(seq=seq + 3, ts=999.0 + rng.random(), step=n))
            seq, n = seq + 4, n + 1
        ingest(run, events)
        h, held = cached(run), recent._cache[run.pk].events
        f = RunHistory.of(reversed(RunEvent.objects.filter(run=run, type__in=HISTORY_EVENTS)
                                   .order_by("-seq").values_list("payload", flat=True)[:held]))
        assert list(h.metrics.items()) == list(f.metrics.items())
        assert [s.seq for s in h.spans] == [s.seq for s in f.spans]
        assert [s.seq for s in h.syncs] == [s.seq for s in f.syncs]
        assert (h.step_ts, h.spans_of_step, h.last_span.seq, h.steps) == (
            f.step_ts, f.spans_of_step, f.last_span.seq, f.steps)
        latest = RunEvent.objects.filter(run=run).order_by("-seq").first().ts
        assert h.last_ts == max(f.last_ts, latest)
        assert held <= 12 + 6 + 16
        trimmed = trimmed or held < previous
        previous = held
    assert len(reads) == 1 and trimmed


def test_keeping_the_last_events_passes_over_events_the_rules_do_not_read():
    from engine.api import LogEvent
    from jobs.alerts.history import RunHistory

    payloads = [metrics(1, 0, loss=1.0).to_dict(), LogEvent(seq=2, ts=2000.0).to_dict(),
                span(3, 1).to_dict(), metrics(4, 1, loss=2.0).to_dict()]
    h = RunHistory.of(payloads)

    h.keep_last(3)

    assert (h.metrics, h.last_ts, [s.seq for s in h.spans]) == (
        RunHistory.of(payloads[1:]).metrics, 2000.0, [3])
    assert list(h._name_sets) == [("loss",)]
