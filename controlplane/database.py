"""DATABASES from the environment: SQLite by default, Postgres when DATABASE_URL is set.

Parsed with urllib so the web process needs no extra package for it:

    postgres://user:pass@host:5432/rlplane?sslmode=require
    sqlite:////abs/path/db.sqlite3        (sqlite:///rel/path is relative to the cwd)
"""

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

POSTGRES_SCHEMES = {"postgres", "postgresql", "pgsql"}


def sqlite_database(path: Path | str) -> dict:
    # WAL lets the dashboard read while ingest writes; IMMEDIATE takes the write lock at
    # BEGIN so concurrent writers wait on `timeout` instead of failing with "locked".
    # The test database is a file beside it too (not Django's shared-cache in-memory
    # default, where a second writer fails at once with "table is locked" instead of
    # waiting), so tests see the same locking as a deployment; one file per test process.
    path = Path(path)
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "TEST": {"NAME": str(path.with_name(f"test-{os.getpid()}-{path.name}"))},
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
    }


def parse_database_url(url: str) -> dict:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        # sqlite:///x -> path "/x" (relative), sqlite:////x -> "//x" (absolute).
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise ImproperlyConfigured("DATABASE_URL: sqlite URL has no file path")
        return sqlite_database(path)
    if parts.scheme not in POSTGRES_SCHEMES:
        raise ImproperlyConfigured(
            f"DATABASE_URL: unsupported scheme {parts.scheme!r}; "
            "use postgres://user:pass@host:port/name or sqlite:///path"
        )
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured("DATABASE_URL: postgres URL has no database name")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": unquote(parts.hostname or ""),
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": dict(parse_qsl(parts.query)),
    }
