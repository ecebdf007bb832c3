"""Who an MLflow request comes from, and which rlplane run it may touch. The token is
treated as hostile: it decides the run, never the request's run_id.

    a run's ingest token      that run only (runs/create attaches to it); any other
                              run_id is refused, whether it exists or not
    an operator's API token   runs/create makes a new external run; writes go to runs
                              its user created; reads any run
    a viewer's API token      reads only
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.auth import bearer_token, is_operator
from jobs.mlflow.protocol import MlflowError
from jobs.models import ApiToken, Run
from jobs.models.run import hash_token
from jobs.models.validators import parse_pk


@dataclass(frozen=True)
class Caller:
    user: object | None = None  # an API token's user
    run: Run | None = None      # a run token's run


def caller_of(request) -> Caller:
    token = bearer_token(request)
    if token is None:
        raise MlflowError("UNAUTHENTICATED", "set MLFLOW_TRACKING_TOKEN to the run's ingest "
                          "token or an rlplane API token (/settings/tokens)")
    if user := ApiToken.user_for(token):
        return Caller(user=user)
    if run := Run.objects.filter(ingest_token_hash=hash_token(token)).first():
        return Caller(run=run)
    raise MlflowError("UNAUTHENTICATED", "this token is neither a run's ingest token nor a "
                      "live API token; create one at /settings/tokens")


def run_pk(run_id: object) -> int:
    pk = parse_pk(run_id) if isinstance(run_id, str) else None
    if pk is None:
        raise MlflowError("RESOURCE_DOES_NOT_EXIST", f"run {run_id!r} does not exist")
    return pk


def readable_run(caller: Caller, run_id: object) -> Run:
    if caller.run is not None:
        return own_run(caller.run, run_id)
    run = Run.objects.filter(pk=run_pk(run_id)).select_related("created_by").first()
    if run is None:
        raise MlflowError("RESOURCE_DOES_NOT_EXIST", f"run {run_id!r} does not exist")
    return run


def writable_run(caller: Caller, run_id: object) -> Run:
    """The external run this caller may log to: its token's own, or one its operator
    created."""
    if caller.run is None:
        require_operator(caller)
        run = readable_run(caller, run_id)
        if run.created_by_id != caller.user.pk:
            raise MlflowError("PERMISSION_DENIED", f"run {run.pk} was not created by this "
                              "token's user; a run's own process logs with its ingest token")
    else:
        run = own_run(caller.run, run_id)
    if not run.is_external:
        raise MlflowError("INVALID_PARAMETER_VALUE", f"run {run.pk} is a run of rlplane's "
                          "own engine, which reports itself; MLflow logs to external runs")
    return run


def own_run(run: Run, run_id: object) -> Run:
    if run_id != str(run.pk):
        raise MlflowError("PERMISSION_DENIED", f"this token is run {run.pk}'s ingest token; "
                          f"it cannot touch run {run_id!r}")
    return Run.objects.select_related("created_by").get(pk=run.pk)


def require_operator(caller: Caller) -> None:
    if caller.run is None and not is_operator(caller.user):
        raise MlflowError("PERMISSION_DENIED", "this API token's user is a viewer and may "
                          "only read; ask an admin to add them to 'operator'")
