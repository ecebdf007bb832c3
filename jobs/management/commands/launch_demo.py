"""Launch the demo run through the same action the new-run form uses, and print its URL.

    manage.py launch_demo [--config configs/demo_arithmetic.toml] [--username operator]
                          [--base-url http://127.0.0.1:8000]
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse

from jobs.runs.actions import do_launch_run


class Command(BaseCommand):
    help = "Launch configs/demo_arithmetic.toml as a run and print the run page's URL."

    def add_arguments(self, parser):
        parser.add_argument("--config", type=Path,
                            default=settings.BASE_DIR / "configs" / "demo_arithmetic.toml")
        parser.add_argument("--username", default=os.environ.get("RLPLANE_ADMIN_USER")
                            or "operator")
        parser.add_argument("--base-url", default=os.environ.get("RLPLANE_URL")
                            or "http://127.0.0.1:8000")

    def handle(self, *args, config: Path, username: str, base_url: str, **options):
        try:
            data = tomllib.loads(config.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise CommandError(f"{config}: {exc}") from exc
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user '{username}'; run manage.py ensure_operator first")
        run = do_launch_run(user=user, name=data.get("name", config.stem), config=data)
        url = base_url.rstrip("/") + reverse("run-detail", args=[run.pk])
        self.stdout.write(f"demo run #{run.pk} launched: {url}")
