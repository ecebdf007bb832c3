"""A run's metric tiers and the retention of raw points (jobs/rollups.py).

    manage.py history --rebuild [--run ID ...]   tiers again from raw points: the given
                                                 runs, else every run with points and no
                                                 tiers (stored before tiers existed)
    manage.py history --drop [--days N]          the retention now: raw points of runs
                                                 finished over N days ago (default
                                                 RLPLANE_RAW_POINTS_RETENTION_DAYS)
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from jobs.models import Run
from jobs.rollups import drop_expired_points, rebuild_rollups


class Command(BaseCommand):
    help = "Rebuild runs' metric tiers, or drop raw points past their retention."

    def add_arguments(self, parser):
        parser.add_argument("--rebuild", action="store_true")
        parser.add_argument("--run", type=int, action="append", default=[],
                            help="a run id (repeatable) for --rebuild")
        parser.add_argument("--drop", action="store_true")
        parser.add_argument("--days", type=float, default=None,
                            help="for --drop: instead of RLPLANE_RAW_POINTS_RETENTION_DAYS")

    def handle(self, *args, rebuild: bool, run: list[int], drop: bool, days, **options):
        if rebuild == drop:
            raise CommandError("give one of --rebuild or --drop")
        if rebuild:
            runs = (Run.objects.filter(pk__in=run) if run else
                    Run.objects.filter(metric_points__isnull=False,
                                       metric_rollups__isnull=True).distinct())
            for target in runs:
                rebuild_rollups(target)
                self.stdout.write(f"run {target.pk}: tiers rebuilt")
            return
        if days is not None and days <= 0:
            raise CommandError(f"--days {days}: give a number of days above 0")
        for run_id, deleted in drop_expired_points(days).items():
            self.stdout.write(f"run {run_id}: {deleted} raw points dropped")
