"""Logins and the deploy switches (issue 19 item 9): logins are throttled (django-axes),
sessions end, and `check --deploy` is clean with the production switches on."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.django_db
def test_repeated_wrong_passwords_lock_the_account_for_that_address(client,
                                                                     django_user_model):
    django_user_model.objects.create_user("olga", password="right-horse-battery")
    answers = [client.post("/login", {"username": "olga", "password": "guess"}).status_code
               for _ in range(settings.AXES_FAILURE_LIMIT)]
    assert answers == [200] * (settings.AXES_FAILURE_LIMIT - 1) + [429]   # the form, then

    locked = client.post("/login", {"username": "olga", "password": "right-horse-battery"})

    assert locked.status_code == 429               # even the right password, for a while
    assert "_auth_user_id" not in client.session
    other = client.post("/login", {"username": "olga", "password": "right-horse-battery"},
                        REMOTE_ADDR="10.9.8.7")     # another address is not locked out
    assert other.status_code == 302


def test_a_login_lasts_hours_not_weeks():
    assert settings.SESSION_COOKIE_AGE == 12 * 3600


def run_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RLPLANE_")
             and k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level",
                           "WARNING"], cwd=REPO, capture_output=True, text=True,
                          env={**clean, "RLPLANE_SECRET_KEY": "k" * 20 + "Zq8#pL2$vN5!" * 4,
                               **env}, timeout=120)


def test_check_deploy_is_clean_with_the_production_switches_on():
    on = run_check({"RLPLANE_SECURE": "1", "RLPLANE_PROXY_TLS": "1",
                    "RLPLANE_ALLOWED_HOSTS": "rl.example.com",
                    "RLPLANE_CSRF_TRUSTED_ORIGINS": "https://rl.example.com"})
    assert on.returncode == 0, on.stdout + on.stderr
    assert "no issues" in on.stdout

    off = run_check({})                             # the embedded default: plain HTTP
    assert off.returncode != 0 and "SECURE_SSL_REDIRECT" in off.stdout + off.stderr
