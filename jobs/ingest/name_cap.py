"""A run's distinct metric names are capped: RLPLANE_MAX_METRIC_NAMES (default 1000).

A run's token writes whatever names it likes, and every name costs every reader: the
run detail (which `rlplane watch` polls every 2 s), the charts' name list, each Prometheus
scrape. Past the cap, a metrics event that would add a name is refused whole (its errors
entry names the cap and the setting), counted in rlplane_ingest_events_total{outcome=
"over_name_cap"}; the names the run already has go on being stored. rlplane's own engine
reports well under 200 names; an external run's unmapped names count too.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings

from engine.api import Event, MetricsEvent, canonical_metrics
from jobs.models import Run, last_steps, stored_metric_names
from jobs.prometheus import INGEST_EVENTS


def stored_names(run: Run, event: MetricsEvent) -> set[str]:
    """The names ``event`` is stored under (an external run's are mapped first)."""
    values = canonical_metrics(run.framework, event.values) if run.is_external else event.values
    return set(values)


def metric_names(run: Run, events: Sequence[Event]) -> set[str]:
    return set().union(*(stored_names(run, e) for e in events if isinstance(e, MetricsEvent)))


def capped_with_steps(run: Run, events: Sequence[Event], capped: bool = True,
                      ) -> tuple[list[Event], list[dict], dict[str, int]]:
    """(the events to store, an error per metrics event refused for adding names past the
    cap (``capped``), the highest stored step of each of their metric names): one read of
    those steps (last_steps) for the cap's check and for the points (ingest reads them
    under the run's lock).

    The common batch repeats names the run has: the read says so (a DISTINCT over them
    read every point of the run, growing with its history); the run's whole name list (a
    seek per name it has) is read only when a name is new, or when the batch names more
    than the cap, whose steps are then read only for the events kept."""
    names = metric_names(run, events)
    if capped and len(names) > min(settings.RLPLANE_MAX_METRIC_NAMES, 10_000):
        kept, errors = refuse_past_cap(run, events)
        names = metric_names(run, kept)
        return kept, errors, last_steps(run, names) if names else {}
    highest = last_steps(run, names) if names else {}
    if not capped or names <= highest.keys():
        return list(events), [], highest
    return *refuse_past_cap(run, events), highest


def within_name_cap(run: Run, events: Sequence[Event]) -> tuple[list[Event], list[dict]]:
    """(the events to store, an error per metrics event refused for adding names past
    the cap, in ingest's batch error shape)."""
    kept, errors, _ = capped_with_steps(run, events)
    return kept, errors


def refuse_past_cap(run: Run, events: Sequence[Event]) -> tuple[list[Event], list[dict]]:
    cap = settings.RLPLANE_MAX_METRIC_NAMES
    known = set(stored_metric_names(run.pk))
    kept, errors = [], []
    for index, event in enumerate(events):
        if isinstance(event, MetricsEvent):
            new = stored_names(run, event) - known
            if new and len(known) + len(new) > cap:
                errors.append({"index": index, "seq": event.seq, "error": (
                    f"run {run.pk} reports {len(known)} metric names and the cap is {cap} "
                    f"(RLPLANE_MAX_METRIC_NAMES): this event's {len(new)} new name(s), "
                    f"e.g. {sorted(new)[0]!r}, are refused; report fewer distinct names")})
                continue
            known |= new
        kept.append(event)
    INGEST_EVENTS.labels("over_name_cap").inc(len(errors))
    return kept, errors
