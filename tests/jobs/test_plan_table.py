"""The planner in the control plane: the fork page's what-if table, fitted from the
parent's stored metrics and spans, and BubbleHigh's runbook naming the best alternative."""

import pytest

from engine.config import validate_config
from jobs.alerts.history import RunFacts, Thresholds
from jobs.alerts.rules import evaluate
from jobs.models import MetricPoint, PhaseSpan, Run, RunStatus

from .helpers import checkpoint_on_disk
from .test_alerts_rules import healthy

DISAGGREGATED = {"name": "parent", "steps": 5, "warm_start": {"steps": 0},
                 "placement": {"type": "disaggregated"}, "weight_sync": {"type": "shm"}}


def step_metrics(step: int) -> dict[str, float]:
    """A sync step: generation 0.5 s, learner 0.4 s, sync 0.05 s, 320 tokens."""
    tokens = 320.0 + 40 * (step % 3)
    return {"time/step_s": 1.0, "time/rollout_s": 0.5, "time/reward_s": 0.01,
            "time/learner_s": 0.4, "time/weight_sync_s": 0.05, "rollout_share": 0.5,
            "throughput/tokens_per_s": tokens, "response_length/max": 6.0 + step % 3,
            "response_length/p50": 4.0, "response_length/p99": 6.0 + step % 3}


@pytest.fixture
def parent(make_run):
    run = make_run(RunStatus.STOPPED, name="parent")
    Run.objects.filter(pk=run.pk).update(
        config=validate_config(DISAGGREGATED).model_dump(mode="json"))
    run.refresh_from_db()
    checkpoint_on_disk(run, 4)
    return run


def store_steps(run: Run, steps: int) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, step=s, name=k, value=v)
        for s in range(steps) for k, v in step_metrics(s).items())
    PhaseSpan.objects.bulk_create(
        PhaseSpan(run=run, device=d, phase="weight_sync", start=10.0 * s, end=10.0 * s + 0.02,
                  step=s, version=s + 1) for s in range(steps) for d in ("gpu:0", "gpu:1"))


def test_the_fork_page_shows_what_the_parent_would_do_under_each_policy(client, operator,
                                                                        parent):
    store_steps(parent, 5)
    page = client.get(f"/runs/{parent.pk}/fork")
    assert page.status_code == 200
    html = page.content.decode()
    assert "What this run would do under each policy and placement" in html
    table = page.context["plan"]
    assert table.fitted_steps == 4                       # the first step left out
    assert {r.policy for r in table.rows} == {"sync", "one_step_off", "fully_async",
                                              "partial_rollout"}
    assert "disaggregated 1x1+1 (this run)" in html and 'class="plan-best"' in html
    # Generation and learning overlap under the streaming policies (partial rollout
    # included): predicted faster.
    assert table.best.policy in ("one_step_off", "fully_async", "partial_rollout") \
        and table.gain > 1.3


def test_a_parent_without_timed_steps_says_why_there_is_no_prediction(client, operator,
                                                                      parent):
    html = client.get(f"/runs/{parent.pk}/fork").content.decode()
    assert "No prediction: it has no timed step yet." in html


def generation_bound():
    """(history, facts) of a disaggregated run whose generation takes 95 % of each step,
    with the timings the planner fits from."""
    facts = RunFacts(config=validate_config(DISAGGREGATED), temperature=0.7)
    h = healthy(**{"rollout_share": lambda s: 0.95})
    for s in h.steps:
        for name, value in step_metrics(s).items():
            if name != "rollout_share":
                h.metrics.setdefault(name, {})[s] = value
    return h, facts


def bubble_high(h, facts):
    [f] = [f for f in evaluate(h, facts, Thresholds(), h.last_ts) if f.kind == "BubbleHigh"]
    return f


def test_bubble_high_names_the_predicted_gain_of_the_best_alternative():
    f = bubble_high(*generation_bound())
    assert "What-if: the planner (fitted on 5 steps) predicts" in f.runbook
    assert "x this run's" in f.runbook
    assert any(f"with {p} on" in f.runbook for p in ("one_step_off", "fully_async",
                                                    "partial_rollout"))


def test_bubble_high_without_what_the_planner_needs_keeps_its_levers_only():
    h = healthy(**{"rollout_share": lambda s: 0.95})
    facts = RunFacts(config=validate_config(DISAGGREGATED), temperature=0.7)
    [f] = [f for f in evaluate(h, facts, Thresholds(), h.last_ts) if f.kind == "BubbleHigh"]
    assert "What-if" not in f.runbook and "Next levers" in f.runbook


def test_bubble_high_fits_the_planner_again_only_when_its_inputs_change(monkeypatch):
    """evaluate() runs at every event; the what-if (a fit and a simulated table, ~60 ms)
    is kept while the timed steps' metrics and spans are what they were."""
    from engine.api import WeightSyncEvent
    from jobs.alerts import bubble

    fits = []
    real = bubble.planner_advice
    monkeypatch.setattr(bubble, "planner_advice", lambda *a: fits.append(1) or real(*a))
    h, facts = generation_bound()

    def runbook() -> str:
        return bubble_high(h, facts).runbook

    first = runbook()
    assert runbook() == first and len(fits) == 1
    h.add(WeightSyncEvent(step=h.steps[-1], version_learner=9, version_rollout=9).to_dict())
    assert runbook() == first and len(fits) == 1          # a sync: not the planner's input
    last = h.steps[-1] + 1
    for name, value in step_metrics(last).items():
        h.metrics.setdefault(name, {})[last] = value
    h.metrics["rollout_share"][last] = 0.95
    h.metrics.setdefault("reward/mean", {})[last] = 0.5
    runbook()
    assert len(fits) == 2                                  # a new timed step: fitted again
