"""ASGI entry point (`uvicorn controlplane.asgi:application`).

Plain Django for now; websocket routing through Channels is added with the control plane.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

application = get_asgi_application()
