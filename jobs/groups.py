"""The channel groups the live pages listen on and the control plane sends to:

    run_group(id)   "run.<id>"  one run's page: its events (ingest), its alerts (lifecycle)
    RUNS_GROUP      "runs"      the runs list: one summary per ingested batch
    session_group(key)          every socket opened with one login session: closed when
                                that session logs out (jobs.apps)
"""

import hashlib

RUNS_GROUP = "runs"


def run_group(run_id: int) -> str:
    return f"run.{run_id}"


def session_group(session_key: str) -> str:
    # Hashed: a group name is visible to whoever can read the channel layer's Redis.
    return "session." + hashlib.sha256(session_key.encode()).hexdigest()[:40]
