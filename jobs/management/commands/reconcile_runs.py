"""Ingest what drivers wrote to their run directories while the control plane was away.

    manage.py reconcile_runs [--run ID ...]
    manage.py reconcile_runs --ray-head-died-at WHEN --exit HOW

The first: the given runs, else every live or lost one (jobs.runs.reconcile); the stack
runs it at start. The second: the stack restarted its Ray head, so every run it held is
reconciled and then marked lost with that cause.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from jobs.models import Run
from jobs.runs.reconcile import do_mark_runs_lost_with_ray_head, do_reconcile_run, runs_to_reconcile


class Command(BaseCommand):
    help = "Reconcile runs from their directories (events, checkpoints, final status)."

    def add_arguments(self, parser):
        parser.add_argument("--run", type=int, action="append", default=[],
                            help="a run id (repeatable); default: every live or lost run")
        parser.add_argument("--ray-head-died-at", default="",
                            help="the Ray head died then: its runs are marked lost")
        parser.add_argument("--exit", default="exited", help="how the Ray head ended")

    def handle(self, *args, run: list[int], ray_head_died_at: str, exit: str, **options):
        if ray_head_died_at:
            for lost, result in do_mark_runs_lost_with_ray_head(ray_head_died_at, exit):
                self.stdout.write(f"run #{lost.pk}: {lost.status} (the Ray head died); "
                                  f"{result}")
            return
        runs = Run.objects.filter(pk__in=run) if run else runs_to_reconcile()
        for one in runs:
            result = do_reconcile_run(one)
            if result.events or result.checkpoints or result.skipped:
                self.stdout.write(f"run #{one.pk} reconciled: {result}")
