import pytest

# What gives a test the database under pytest-django (which refuses it to any other test):
# the django_db marker, or one of these fixtures anywhere in its fixture closure.
DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences",
               "django_db_serialized_rollback", "live_server"}


def pytest_collection_modifyitems(items):
    """Mark every test that can reach the database ``db``: scripts/test runs exactly those
    again on PostgreSQL (``-m db``); a test without it cannot touch a database at all."""
    for item in items:
        if item.get_closest_marker("django_db") or DB_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.db)
