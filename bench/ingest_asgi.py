"""The control plane's ASGI app as bench/ingest.py serves it: the same application, with
each broadcast event stamped ``committed_at`` (unix seconds) when it leaves for the
channel layer. Ingest broadcasts on commit (transaction.on_commit), so the stamp is the
commit's time to within the on_commit call, and a client's receipt minus the stamp is
the commit -> client latency the fan-out figures report. Nothing is stored stamped: the
stored payloads were written before the commit.

    uvicorn bench.ingest_asgi:application
"""

import logging
import time

from controlplane.asgi import application  # noqa: F401 (served; sets Django up)
from jobs.ingest import store

_broadcast = store.broadcast_events


def broadcast_stamped(run_id: int, events: list[dict], summary: dict | None = None) -> None:
    now = time.time()
    _broadcast(run_id, [{**e, "committed_at": now} for e in events], summary)


store.broadcast_events = broadcast_stamped

# A 500's traceback in the bench's server log (Django prints it only under DEBUG).
logging.getLogger("django.request").addHandler(logging.StreamHandler())
