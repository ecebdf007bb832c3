"""One run's alert evaluation after a batch, its history read whole against read
incrementally (jobs/alerts/recent.py), side by side on the same run.

    setup   a throwaway database (bench/ingest.py's: --database-url PostgreSQL, else a
            SQLite file); one running run with --steps steps stored through ingest (the
            HTTP sink's batches: per step a span per phase and a metrics event of --values
            values), the rules not run meanwhile
    rounds  --rounds times: one more batch stored, then the debounced evaluation the
            worker runs (jobs.alerts.debounce.do_evaluate_run_alerts), timed twice on
            that same state: with this process's cached history dropped first (what
            every evaluation read before: the last HISTORY_LIMIT events), and with it
            kept (the events since the last evaluation); alternating which goes first
    prints  the median of each, and their ratio; and the mean of the incremental ones,
            which includes the evaluations where the window moved past its SLACK (every
            SLACK / --batch rounds: give --rounds past it)

    .venv/bin/python bench/alert_evaluation.py --steps 2000 \\
        --database-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ingest import EVENTS_PER_STEP, batch_events, metric_names  # noqa: E402
from bench.ingest_stack import Database, create_runs, setup_django  # noqa: E402
from engine.api import event_from_dict  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000, help="steps stored before timing")
    ap.add_argument("--values", type=int, default=64, help="metric values per step")
    ap.add_argument("--batch", type=int, default=200, help="events per batch")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--database-url", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rlplane-bench-") as tmp:
        database = Database(args.database_url, Path(tmp))
        try:
            setup_django(database.url, "redis://127.0.0.1:6379/13")
            return run_bench(args, database)
        finally:
            database.drop()


def run_bench(args, database) -> dict:
    from jobs.alerts import recent
    from jobs.alerts.debounce import do_evaluate_run_alerts
    from jobs.ingest import store
    from jobs.models import Run

    (run_id, _), = create_runs(1, "alerts")
    run, names = Run.objects.get(pk=run_id), metric_names(args.values)
    rules_after_ingest, store.evaluate_alerts_soon = store.evaluate_alerts_soon, lambda _: None
    seq = step = 1

    def batch() -> None:
        nonlocal seq, step
        events = batch_events(seq, step, names, args.batch, time.time())
        seq, step = seq + len(events), step + len(events) // EVENTS_PER_STEP
        store.do_ingest_events(run, [event_from_dict(e) for e in events])

    try:
        while step <= args.steps:
            batch()
        do_evaluate_run_alerts(run_id)   # the cache holds the run, as after every batch
        whole, incremental = [], []
        for i in range(args.rounds):
            batch()
            for cold in ((True, False) if i % 2 else (False, True)):
                kept = dict(recent._cache)
                if cold:
                    recent.forget()
                began = time.perf_counter()
                do_evaluate_run_alerts(run_id)
                (whole if cold else incremental).append(time.perf_counter() - began)
                if cold:   # the warm one of this round starts from the same cache
                    recent._cache.update(kept)
    finally:
        store.evaluate_alerts_soon = rules_after_ingest
    result = {"database": "postgresql" if database.postgres else "sqlite",
              "steps": step - 1, "events": seq - 1,
              "whole_ms": 1000 * statistics.median(whole),
              "incremental_ms": 1000 * statistics.median(incremental),
              "incremental_mean_ms": 1000 * statistics.mean(incremental)}
    result["ratio"] = result["whole_ms"] / result["incremental_ms"]
    print(f"alert evaluation after a batch ({result['database']}, a run of "
          f"{result['steps']:,} steps, {result['events']:,} events, {args.values} values a "
          f"step; medians of {args.rounds}): history read whole "
          f"{result['whole_ms']:.1f} ms, read incrementally {result['incremental_ms']:.1f} ms"
          f" ({result['ratio']:.1f}x); incremental mean {result['incremental_mean_ms']:.1f} ms"
          f" (the window moved past its slack included)")
    return result


if __name__ == "__main__":
    main()
