"""The channel groups the live pages listen on and the control plane sends to:

    run_group(id)   "run.<id>"  one run's page: its events (ingest), its alerts (lifecycle)
    RUNS_GROUP      "runs"      the runs list: one summary per ingested batch
"""

RUNS_GROUP = "runs"


def run_group(run_id: int) -> str:
    return f"run.{run_id}"
