import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.database import parse_database_url


def test_healthz_answers_ok(client):
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"ok": True}


def test_the_index_page_renders_for_a_logged_in_user(admin_client):
    response = admin_client.get("/")

    assert response.status_code == 200
    assert b"rlplane" in response.content
    assert [t.name for t in response.templates][:2] == ["jobs/index.html", "base.html"]


def test_a_postgres_database_url_becomes_django_settings():
    db = parse_database_url("postgres://rl%40ops:p%2Fss@db.internal:6543/rlplane?sslmode=require")

    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["NAME"], db["USER"], db["PASSWORD"]) == ("rlplane", "rl@ops", "p/ss")
    assert (db["HOST"], db["PORT"]) == ("db.internal", "6543")
    assert db["OPTIONS"] == {"sslmode": "require"}


def test_a_sqlite_database_url_keeps_its_absolute_path_and_wal():
    db = parse_database_url("sqlite:////var/lib/rlplane/db.sqlite3")

    assert db["NAME"] == "/var/lib/rlplane/db.sqlite3"
    assert "journal_mode=WAL" in db["OPTIONS"]["init_command"]


def test_an_unknown_database_scheme_is_a_clear_error():
    with pytest.raises(ImproperlyConfigured, match="unsupported scheme 'mysql'"):
        parse_database_url("mysql://u:p@h/db")
