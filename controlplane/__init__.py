"""The rlplane Django project: settings, urls, the ASGI/WSGI entry points and the Celery app."""

# Loaded with Django, so @shared_task binds to this app (its broker and beat schedule).
from controlplane.celery import app as celery_app

__all__ = ("celery_app",)
