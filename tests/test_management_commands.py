"""manage.py ensure_operator and launch_demo, as the embedded stack calls them."""

from __future__ import annotations

import stat
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from jobs.auth import is_operator
from jobs.models import Run

pytestmark = pytest.mark.django_db


def ensure_operator(credentials, **options) -> str:
    out = StringIO()
    call_command("ensure_operator", credentials_file=credentials, stdout=out, **options)
    return out.getvalue()


def test_a_generated_password_is_printed_once_and_kept_private(tmp_path, monkeypatch):
    monkeypatch.delenv("RLPLANE_ADMIN_PASSWORD", raising=False)
    credentials = tmp_path / "operator.json"

    first = ensure_operator(credentials)
    second = ensure_operator(credentials)

    password = first.split("password ")[1].split()[0]
    user = get_user_model().objects.get(username="operator")
    assert user.check_password(password)
    assert is_operator(user)
    assert password not in second
    assert f"password in {credentials}" in second
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    assert password in credentials.read_text()


def test_the_password_from_the_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPLANE_ADMIN_PASSWORD", "correct horse battery")
    credentials = tmp_path / "operator.json"

    out = ensure_operator(credentials, username="alice")

    user = get_user_model().objects.get(username="alice")
    assert user.check_password("correct horse battery")
    assert is_operator(user)
    assert "correct horse" not in out
    assert not credentials.exists()


def test_a_password_set_by_hand_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("RLPLANE_ADMIN_PASSWORD", raising=False)
    get_user_model().objects.create_user("operator", password="chosen by a human")

    out = ensure_operator(tmp_path / "operator.json")

    assert get_user_model().objects.get(username="operator").check_password("chosen by a human")
    assert "RLPLANE_ADMIN_PASSWORD resets it" in out


def test_launch_demo_queues_the_demo_config_as_the_operator_and_prints_its_page(
        django_capture_on_commit_callbacks):
    operator = get_user_model().objects.create_user("operator")
    out = StringIO()

    with django_capture_on_commit_callbacks(execute=False) as queued:
        call_command("launch_demo", base_url="http://ctl:8000/", stdout=out)

    run = Run.objects.get()
    assert (run.name, run.status, run.created_by) == ("demo_arithmetic", "queued", operator)
    assert len(queued) == 1      # submit_run, once the row committed
    assert out.getvalue().strip() == f"demo run #{run.pk} launched: http://ctl:8000/runs/{run.pk}"


def test_launch_demo_needs_the_operator_account():
    with pytest.raises(CommandError, match="run manage.py ensure_operator first"):
        call_command("launch_demo", username="nobody")
