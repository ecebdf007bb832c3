"""The rlplane Django project: settings, urls and the ASGI/WSGI entry points."""
