"""Make sure an operator account exists, for the embedded stack's first login.

    manage.py ensure_operator [--username NAME] [--credentials-file PATH]

The password comes from RLPLANE_ADMIN_PASSWORD when set (and is then reset to it);
otherwise one is generated, printed once and kept in the credentials file (mode 0600).
An existing account whose password someone set by hand is left as it is.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django.db import transaction

from jobs.auth import OPERATOR_GROUP


class Command(BaseCommand):
    help = "Create (or keep) the operator account and put it in the operator group."

    def add_arguments(self, parser):
        parser.add_argument("--username", default=os.environ.get("RLPLANE_ADMIN_USER")
                            or "operator")
        parser.add_argument("--credentials-file", type=Path,
                            default=settings.STATE_DIR / "operator.json")

    def handle(self, *args, username: str, credentials_file: Path, **options):
        from_env = os.environ.get("RLPLANE_ADMIN_PASSWORD")
        with transaction.atomic():
            user, created = get_user_model().objects.get_or_create(username=username)
            user.groups.add(Group.objects.get_or_create(name=OPERATOR_GROUP)[0])
            if from_env:
                user.set_password(from_env)
                user.save()
                self.stdout.write(f"operator '{username}' (password from RLPLANE_ADMIN_PASSWORD)")
                return
            saved = read_credentials(credentials_file)
            if not created and user.has_usable_password():
                if saved.get("username") == username and user.check_password(
                        saved.get("password", "")):
                    where = f"password in {credentials_file}"
                else:
                    where = "its password was set earlier; RLPLANE_ADMIN_PASSWORD resets it"
                self.stdout.write(f"operator '{username}' ({where})")
                return
            password = secrets.token_urlsafe(12)
            user.set_password(password)
            user.save()
        write_credentials(credentials_file, username, password)
        self.stdout.write(f"operator '{username}', password {password} "
                          f"(printed once; kept in {credentials_file})")


def read_credentials(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def write_credentials(path: Path, username: str, password: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"username": username, "password": password}, f)
