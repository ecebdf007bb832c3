"""A client retry racing its original request (issue 19 item 12): the HTTP sink resends a
batch whose answer timed out, while the first request is still being stored. Both
requests run at once, each on its own database connection, as two server workers would;
on PostgreSQL (scripts/test runs tests/jobs there too) the row lock in do_ingest_events is
what keeps them apart.

The unique (run, seq) constraint alone would keep RunEvent rows single; what the lock
protects is the rest: rows derived from new events (spans have no unique key), the
counts each request answers, and the broadcast of each event once."""

import threading

import pytest
from django.db import connection
from django.db.backends.signals import connection_created
from django.test import Client

from jobs.models import MetricPoint, PhaseSpan, RunEvent

from .helpers import metrics, post_events, span

pytestmark = pytest.mark.django_db(transaction=True)

BATCH = [e for step in range(1, 101) for e in (span(2 * step - 1, step),
                                              metrics(2 * step, step, **{"reward/mean": 0.5}))]


def race(run, token, requests: int = 2) -> list:
    start, responses = threading.Barrier(requests), []

    def retry():
        try:
            start.wait()
            responses.append(post_events(Client(), run, token, BATCH))
        finally:
            connection.close()

    threads = [threading.Thread(target=retry) for _ in range(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return responses


@pytest.mark.parametrize("attempt", range(3))  # a race can go either way: run it a few times
def test_two_identical_posts_racing_store_every_event_once(run, token, attempt):
    responses = race(run, token)

    assert [r.status_code for r in responses] == [200, 200]
    counts = sorted((r.json()["stored"], r.json()["duplicates"]) for r in responses)
    assert counts == [(0, len(BATCH)), (len(BATCH), 0)]
    assert all(r.json()["last_seq"] == len(BATCH) for r in responses)
    assert list(RunEvent.backfill(run).values_list("seq", flat=True)) == list(
        range(1, len(BATCH) + 1))
    assert PhaseSpan.objects.filter(run=run).count() == len(BATCH) // 2
    assert MetricPoint.objects.filter(run=run).count() == len(BATCH) // 2


def test_batches_outside_a_transaction_reuse_the_ingest_threads_connections(run, token,
                                                                           settings):
    """A connection per batch cost PostgreSQL a new backend each time (jobs.ingest.
    endpoints): the ingest threads keep theirs from batch to batch. SQLite's are not kept
    (CONN_MAX_AGE 0: one opens a file): its batches are checked stored."""
    created = []

    def count(sender, connection, **kwargs):
        created.append(connection)

    connection_created.connect(count)
    try:
        for seq in range(1, 9):
            response = post_events(Client(), run, token, [metrics(seq, seq, loss=0.5)])
            assert response.status_code == 200
    finally:
        connection_created.disconnect(count)

    if connection.settings_dict["CONN_MAX_AGE"]:
        assert len(created) <= settings.RLPLANE_INGEST_CONCURRENCY
    assert MetricPoint.objects.filter(run=run).count() == 8
