"""What MLflow's writes do to an rlplane run. Metrics and the end status become engine
events stored by ingest's own do_ingest_events (so metric points, alerts and the live
pages follow as for any driver), numbered after the run's highest seq under the run's
lock: two requests racing never take the same seq (the later one's events would be
dropped as replays). Params join the external run's params, validated and bounded like
any ExternalRunConfig; what MLflow knows beyond params (experiment, tags) is kept under
params["mlflow"].
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Sequence

from django.db import transaction

from engine.api import Event, LogEvent, MetricsEvent, RunStatusEvent
from engine.config import ConfigError, validate_external
from jobs.ingest.batch import MAX_SAFE_INT, parse_event
from jobs.ingest.name_cap import within_name_cap
from jobs.ingest.store import do_ingest_events
from jobs.mlflow.access import Caller, require_operator, writable_run
from jobs.mlflow.protocol import (
    ENDED,
    MAX_KEY_CHARS,
    integer,
    invalid,
    metric_value,
    text,
)
from jobs.models import Run, RunEvent, RunStatus
from jobs.runs.actions import do_create_external_run

META = "mlflow"
"""The params key that holds the run's MLflow experiment and tags."""
RUN_NAME_TAG = "mlflow.runName"
FRAMEWORK_TAG = "rlplane.framework"
NAME_CHARS = re.compile(r"[^A-Za-z0-9_.\-]+")
# Within ExternalRunConfig's 64 KiB of params: the user's own, then the tags (an
# experiment id, at most 500 characters, and a count fit in the rest).
PARAMS_BUDGET = 52 * 1024
TAGS_BUDGET = 10 * 1024
NUMBER = re.compile(r"^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def split_params(run: Run) -> tuple[dict, dict]:
    """An external run's (params as MLflow logged them, its MLflow meta)."""
    if not run.is_external:
        return {}, {}
    params = dict(run.external_config.params)
    meta = params.pop(META, None)
    return params, meta if isinstance(meta, dict) else {}


def param_value(value: str):
    """A logged param as the run page reads params: MLflow sends every value as text,
    but the page takes a run's planned steps from an integer max_steps and compare
    lines numbers up, so numeric text becomes a number; anything else stays text."""
    if len(value) <= 32 and NUMBER.match(value):  # int() of thousands of digits raises
        if re.fullmatch(r"-?\d+", value):  # past 2**53 a browser would round it: text
            return int(value) if abs(int(value)) <= MAX_SAFE_INT else value
        if math.isfinite(number := float(value)):
            return number
    return value


def json_size(value) -> int:
    return len(json.dumps(value))


def bounded_update(target: dict, new: dict, budget: int) -> int:
    """Add ``new``'s items to ``target`` while its JSON stays within ``budget`` bytes;
    returns how many did not fit."""
    size, dropped = json_size(target), 0
    for key, value in new.items():
        grows = json_size({key: value}) - (json_size({key: target[key]}) if key in target else 0)
        if size + grows > budget:
            dropped += 1
            continue
        target[key] = value
        size += grows
    return dropped


def merged_config(config: dict, params: dict[str, str], tags: dict[str, str],
                  experiment_id: str | None) -> dict:
    """``config`` with the params and tags added (a later value wins), validated.

    An external run's params are bounded (ExternalRunConfig: 64 KiB of JSON). veRL logs
    its whole flattened config and transformers every TrainingArguments field plus the
    model config, and the client raises what the server refuses -- at the training
    script's start. So what does not fit is dropped and counted in the meta rather than
    refused: the run goes on, its page shows the params that fit.
    """
    if META in params:
        raise invalid(f"the param key '{META}' is reserved by rlplane; rename the param")
    own = {k: v for k, v in config.get("params", {}).items() if k != META}
    meta = dict(config.get("params", {}).get(META) or {})
    dropped = bounded_update(own, {k: param_value(v) for k, v in params.items()},
                             PARAMS_BUDGET)
    # The run's name holds mlflow.runName.
    tags = {k: v for k, v in tags.items() if k != RUN_NAME_TAG}
    meta["tags"] = meta.get("tags", {})
    dropped += bounded_update(meta["tags"], tags, TAGS_BUDGET)
    if not meta["tags"]:
        del meta["tags"]
    if dropped:
        meta["dropped"] = meta.get("dropped", 0) + dropped
    if experiment_id:
        meta["experiment_id"] = experiment_id
    if meta:
        own[META] = meta  # last, so the run page's first params are the user's own
    merged = {**config, "params": own}
    try:
        return validate_external(merged).model_dump(mode="json")
    except ConfigError as exc:
        raise invalid("; ".join(f"{path}: {message}" for path, message in exc.errors)) from None


def metric_events(items: list[dict]) -> list[MetricsEvent]:
    """MLflow metrics -> one metrics event per step, in step order."""
    now_ms = int(time.time() * 1000)
    by_step: dict[int, MetricsEvent] = {}
    for item in items:
        key = text(item, "key", MAX_KEY_CHARS)
        value = metric_value(item.get("value"), key)
        step = integer(item.get("step"), "step", 0)
        ts = integer(item.get("timestamp"), "timestamp", now_ms) / 1000
        by_step.setdefault(step, MetricsEvent(ts=ts, step=step, values={})).values[key] = value
    return [by_step[step] for step in sorted(by_step)]


def status_event(mlflow_status: str, end_time_ms: int | None) -> RunStatusEvent:
    ts = (end_time_ms or int(time.time() * 1000)) / 1000
    if mlflow_status in ENDED:
        return RunStatusEvent(ts=ts, status=ENDED[mlflow_status],
                              message=f"its MLflow client ended the run {mlflow_status}")
    return RunStatusEvent(ts=ts, status="running", message="its MLflow client started the run")


def do_report(run: Run, events: Sequence[Event] = (), params: dict | None = None,
              tags: dict | None = None, experiment_id: str | None = None) -> Run:
    """Store params/tags on the run and ingest ``events`` (seq not yet assigned), all or
    nothing: a value ingest would refuse refuses the whole request."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if params or tags or experiment_id:
            locked.config = merged_config(locked.config, params or {}, tags or {},
                                          experiment_id)
            locked.save(update_fields=["config"])
        if events:
            stored = RunEvent.highest_seq(locked)
            numbered = []
            for i, event in enumerate(events, start=1):
                try:
                    numbered.append(parse_event(
                        dataclasses.replace(event, seq=stored + i).to_dict(), stored))
                except ValueError as exc:
                    raise invalid(str(exc)) from None
            kept, over_cap = within_name_cap(locked, numbered)
            if over_cap:  # all or nothing, as for any value ingest refuses
                raise invalid(over_cap[0]["error"])
            do_ingest_events(locked, kept)
    return locked


def do_open_run(caller: Caller, experiment_id: str, run_name: str,
                tags: dict[str, str]) -> Run:
    """runs/create: a run token's own run (started, if it still waits), or for an
    operator's token a new external run, running from now."""
    if caller.run is not None:
        run = writable_run(caller, str(caller.run.pk))
        waiting = run.status in (RunStatus.QUEUED, RunStatus.SUBMITTING)
        return do_report(run, [status_event("RUNNING", None)] if waiting else [],
                         tags=tags, experiment_id=experiment_id)
    require_operator(caller)
    name = NAME_CHARS.sub("-", run_name or tags.get(RUN_NAME_TAG, "")).strip("-")[:100]
    config = merged_config({"name": name or "mlflow-run",
                            "framework": tags.get(FRAMEWORK_TAG, "script"), "params": {}},
                           {}, tags, experiment_id)
    run, _token = do_create_external_run(caller.user, config)  # the caller's token logs
    return Run.objects.select_related("created_by").get(pk=run.pk)


def do_drop_artifact(run: Run, name: str) -> None:
    """rlplane keeps no artifacts; the run's log says which one its process sent."""
    do_report(run, [LogEvent(ts=time.time(), level="warning", message=(
        f"MLflow artifact {name[:200]!r} not kept: rlplane keeps no artifacts"))])
