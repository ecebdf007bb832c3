"""Alerts on external runs (issue 29): each rule declares what it reads; on a run of
another framework a rule that lacks its inputs is listed as not evaluated, with the
canonical names it needs, on the run page and the alerts page; a rule that has them fires
as on a native run, with a runbook in that framework's terms; a process that stops
reporting raises StoppedReporting. Also the external run in the runs list, run page,
compare and Prometheus, and the new-run form that creates one.

The metrics are ingested under the canonical names the framework's mapping gives
(engine/frameworks.py, from another branch until merged), plus names no mapping has,
which stay as they are.
"""

import html
import time

import pytest

from engine.api import MetricsEvent
from engine.api import metrics as M
from jobs.alerts import coverage as coverage_module
from jobs.alerts import lifecycle
from jobs.alerts.coverage import coverage
from jobs.alerts.history import RunFacts, RunHistory, Thresholds
from jobs.alerts.rules import RULES, evaluate
from jobs.alerts.tasks import evaluate_alerts
from jobs.alerts.views import run_coverage
from jobs.ingest.store import do_ingest_events
from jobs.models import Alert, MetricPoint, Run, RunStatus
from jobs.runs.actions import do_create_external_run

pytestmark = pytest.mark.django_db

STEPS = 20   # the stuck-reward window


def constant(value):
    return lambda step: value


# framework -> (params, {metric: value of step}, the kind that fires, a kind not evaluated
# and the canonical names it is listed with, a word its runbook says in that framework's terms)
CASES = {
    "trl": ({"temperature": 0.7},
            {M.REWARD_MEAN: constant(0.5), M.REWARD_STD: constant(0.0),
             M.SAMPLES_ZERO_STD_GROUP_FRAC: constant(1.0), M.LEARNER_KL_REF: constant(0.01),
             "sampling/importance_sampling_ratio/mean": constant(1.0)},
            "StuckReward", ("LogprobGapHigh", [M.LOGPROB_GAP_MEAN]), "num_generations"),
    "verl": ({"total_training_steps": 100},
             {M.REWARD_MEAN: lambda s: 0.02 * s, M.TIME_STEP_S: constant(10.0),
              M.TIME_ROLLOUT_S: constant(9.5), M.TIME_LEARNER_S: constant(0.5),
              "perf/mfu": constant(0.3)},
             "BubbleHigh", ("StuckReward", [M.SAMPLES_ZERO_STD_GROUP_FRAC, M.REWARD_STD]),
             "data.max_response_length"),
    "openrlhf": ({},
                 {M.REWARD_MEAN: constant(0.2), M.REWARD_STD: constant(0.0),
                  M.TIME_STEP_S: constant(5.0), M.TIME_ROLLOUT_S: constant(2.0)},
                 "StuckReward", ("StalenessOverBound", [M.STALENESS_MAX]),
                 "--n_samples_per_prompt"),
    "prime-rl": ({"max_async_level": 1},
                 {M.STALENESS_MAX: constant(3.0), M.STALENESS_MEAN: constant(1.5),
                  M.LEARNER_LOSS: constant(0.1), "train/agg/math/reward/mean": constant(0.4)},
                 "StalenessOverBound", ("StuckReward", [M.REWARD_MEAN]), "max_async_level"),
    "script": ({},
               {M.REWARD_MEAN: lambda s: 0.02 * s, M.LOGPROB_GAP_MEAN: constant(0.5)},
               "LogprobGapHigh", ("BubbleHigh", [M.TIME_STEP_S]), "truncated importance"),
}


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("olga")


def external_run(user, framework, params=None) -> Run:
    run, _ = do_create_external_run(user, {"name": f"{framework}-run", "framework": framework,
                                           "params": params or {}})
    return run


def reported(run, values_of, steps=STEPS, start=None, every=1.0):
    """``steps`` metrics events, one per step, ``every`` seconds apart from ``start``
    (default: just now, so the run is still reporting)."""
    start = time.time() - steps * every if start is None else start
    do_ingest_events(run, [
        MetricsEvent(seq=step + 1, ts=start + step * every, step=step,
                     values={name: fn(step) for name, fn in values_of.items()})
        for step in range(steps)])


def test_every_rule_declares_canonical_metrics():
    for kind, rule in RULES.items():
        needs = rule.needs
        assert set(needs.metrics + needs.any_of) <= set(M.METRICS), kind


@pytest.mark.parametrize("framework", list(CASES))
def test_an_external_run_lists_what_no_rule_watches_and_fires_what_has_its_inputs(
        user, operator, framework):
    params, values_of, fires, (quiet, needs), knob = CASES[framework]
    run = external_run(user, framework, params)

    reported(run, values_of)

    gaps = {g["kind"]: g for g in run_coverage(run)["gaps"]}
    assert quiet in gaps
    listed = [m["name"] for m in gaps[quiet]["metrics"] + gaps[quiet]["any_of"]]
    assert set(needs) <= set(listed)
    assert fires not in gaps
    alert = Alert.objects.get(run=run, kind=fires)
    assert knob in alert.runbook
    assert "algorithm." not in alert.runbook and "async_policy." not in alert.runbook
    page = html.unescape(operator.get(f"/runs/{run.pk}").content.decode())
    assert "Not evaluated on this" in page and quiet in page and needs[0] in page


def test_a_rule_that_needs_a_fact_the_params_do_not_give_is_not_evaluated_not_guessed(user):
    run = external_run(user, "prime-rl")          # no max_async_level: no staleness bound

    reported(run, {M.STALENESS_MAX: constant(3.0)}, steps=3)

    gap = next(g for g in run_coverage(run)["gaps"] if g["kind"] == "StalenessOverBound")
    assert "staleness_bound" in gap["other"][0] and not gap["metrics"]
    assert not Alert.objects.filter(run=run).exists()


def test_the_alerts_page_lists_the_unevaluated_rules_of_live_external_runs(user, operator):
    run = external_run(user, "trl")
    reported(run, {M.REWARD_MEAN: lambda s: 0.1 * s}, steps=3)

    page = html.unescape(operator.get("/alerts").content.decode())

    assert f"run #{run.pk}" in page and "LogprobGapHigh" in page and M.LOGPROB_GAP_MEAN in page


def test_a_native_run_shows_no_coverage_and_runs_every_rule(make_run):
    run = make_run()
    assert run_coverage(run) is None
    evaluated, gaps = coverage(RunHistory(), RunFacts())
    assert len(evaluated) + len(gaps) == len(RULES)


def history(arrivals: list[float]) -> RunHistory:
    h = RunHistory()
    for step, ts in enumerate(arrivals):
        h.add({"type": "metrics.append", "seq": step + 1, "ts": ts, "step": step,
               "values": {M.REWARD_MEAN: 0.1 * step}})
    return h


def test_stopped_reporting_fires_on_a_silent_external_process_and_not_on_a_reporting_one():
    h = history([1000.0 + 30 * i for i in range(5)])        # a step every 30 s until 1120
    facts = RunFacts(framework="trl", temperature=None, staleness_bound=None)

    def kinds(now, f=facts):
        return {finding.kind for finding in evaluate(h, f, Thresholds(), now)}

    assert "StoppedReporting" not in kinds(1120.0 + 200)     # under 10x its 30 s
    assert "StoppedReporting" in kinds(1120.0 + 301)
    assert "StoppedReporting" not in kinds(1120.0 + 301, RunFacts())   # native: PhaseHang's
    assert "StoppedReporting" not in kinds(
        1120.0 + 301, RunFacts(framework="trl", status="succeeded"))


def test_the_periodic_task_raises_stopped_reporting_on_a_silent_external_run(
        user, monkeypatch):
    silent, talking = external_run(user, "trl"), external_run(user, "verl")
    for run in (silent, talking):
        reported(run, {M.REWARD_MEAN: lambda s: 0.1 * s}, steps=4)
    assert not Alert.objects.exists()            # both reported just now

    later = time.time() + 600                    # 10 minutes on, only one spoke again
    do_ingest_events(talking, [MetricsEvent(seq=5, ts=later - 1, step=4,
                                            values={M.REWARD_MEAN: 0.5})])
    monkeypatch.setattr(lifecycle.time, "time", lambda: later)
    evaluate_alerts()

    alert = Alert.objects.get(kind="StoppedReporting")
    assert alert.run == silent and "TRL process stopped reporting" in alert.cause


def test_the_runs_list_run_page_and_prometheus_name_the_framework(
        user, operator, make_run, settings, client):
    run = external_run(user, "verl")
    reported(run, {M.REWARD_MEAN: constant(0.1), "perf/mfu": constant(0.3),
                   M.LEARNER_KL_REF: constant(0.01)}, steps=3)

    listing = operator.get("/").content.decode()
    page = operator.get(f"/runs/{run.pk}")
    settings.RLPLANE_METRICS_TOKEN = "scrape"
    scrape = client.get("/metrics", headers={"Authorization": "Bearer scrape"}).content.decode()

    assert "framework-verl" in listing and "veRL" in listing
    text = page.content.decode()
    assert "framework-verl" in text and f"/runs/{run.pk}/fork" not in text
    assert "Live controls" not in text
    charts = {c["id"] for c in page.context["data"]["charts"]}
    assert {"other-perf-mfu", "other-learner-kl_ref"} <= charts   # names no chart reads
    assert 'framework="verl"' in scrape


def test_compare_puts_an_external_run_beside_a_native_one(user, operator, make_run):
    native, external = make_run(name="native"), external_run(user, "trl", {"beta": 0.04})
    for run in (native, external):
        MetricPoint.objects.bulk_create(MetricPoint(run=run, step=s, name=M.REWARD_MEAN,
                                                    value=s / 10) for s in range(3))

    response = operator.get(f"/runs/compare?ids={native.pk},{external.pk}")

    assert response.status_code == 200
    data = response.context["data"]
    keys = {row["key"] for row in data["config_diff"]}
    assert {"framework", "params.beta", "name"} <= keys
    reward = next(c for c in data["charts"] if c["metric"] == M.REWARD_MEAN)
    assert [len(t["y"]) for t in reward["traces"]] == [3, 3]
    assert reward["traces"][1]["name"].endswith("(TRL)")


def test_the_external_form_creates_a_run_and_shows_its_token_once(operator):
    assert b"external-run-form" in operator.get("/runs/new/external").content
    assert b"/runs/new/external" in operator.get("/runs/new").content

    response = operator.post("/runs/new/external", {
        "name": "grpo-qwen", "framework": "trl",
        "params": "learning_rate = 1e-6\nmax_steps = 40\n"})

    run = Run.objects.get()
    lines = dict(line.split("=", 1) for line in
                 response.content.decode().split("<pre")[1].split(">", 1)[1]
                 .split("</pre>")[0].split())
    assert run.is_external and run.status == RunStatus.RUNNING
    assert run.external_config.params == {"learning_rate": 1e-6, "max_steps": 40}
    assert lines["RLPLANE_RUN_ID"] == str(run.pk)
    assert lines["MLFLOW_TRACKING_URI"] == lines["RLPLANE_URL"] + "/mlflow"
    assert lines["RLPLANE_TOKEN"] == lines["MLFLOW_TRACKING_TOKEN"]
    assert run.has_ingest_token(lines["RLPLANE_TOKEN"])
    assert response["Cache-Control"] == "no-store"
    assert lines["RLPLANE_TOKEN"] not in operator.get(f"/runs/{run.pk}").content.decode()


def test_the_external_form_names_a_bad_field_and_launches_a_command(operator, queued):
    bad = operator.post("/runs/new/external", {"name": "x", "framework": "trl",
                                               "params": "not = [toml"})
    assert bad.status_code == 200 and "neither a JSON object nor TOML" in bad.content.decode()
    env = operator.post("/runs/new/external", {"name": "x", "framework": "verl",
                                               "entrypoint": "python -m verl.trainer.main_ppo",
                                               "env": "RLPLANE_TOKEN=mine"})
    assert "set by rlplane" in env.content.decode() and not Run.objects.exists()

    launched = operator.post("/runs/new/external", {
        "name": "v", "framework": "verl", "params": '{"total_training_steps": 10}',
        "entrypoint": "python -m verl.trainer.main_ppo", "gpus": "1", "cpus": "2"})

    run = Run.objects.get()
    assert launched.status_code == 302 and launched["Location"] == f"/runs/{run.pk}"
    assert run.status == RunStatus.QUEUED and run.external_config.launch.gpus == 1


def test_the_panel_names_what_the_framework_logs_for_a_missing_metric(
        user, operator, monkeypatch):
    """their_names (engine.frameworks) says what a framework logs for a canonical name;
    a name it has none for is asked for as it is."""
    theirs = {M.LOGPROB_GAP_MEAN: ["sampling/sampling_logp_difference/mean"]}
    monkeypatch.setattr(coverage_module, "their_names",
                        lambda framework, name: theirs.get(name, [name]))
    run = external_run(user, "trl")
    reported(run, {M.REWARD_MEAN: lambda s: 0.1 * s}, steps=3)

    page = html.unescape(operator.get(f"/runs/{run.pk}").content.decode())

    assert "TRL logs it as <code>sampling/sampling_logp_difference/mean</code>" in page
    assert "TRL logs it as <code>reward/error_frac" not in page


def test_an_external_run_lacking_a_rules_input_is_skipped_where_a_native_run_is_judged():
    """A flat reward with no spread logged at all: the engine always logs reward/std, so
    on a native run its absence reads as no spread; on an external run it is unknown."""
    h = history([1000.0 + i for i in range(STEPS)])
    for step in range(STEPS):
        h.metrics[M.REWARD_MEAN][step] = 0.5
    external = RunFacts(framework="openrlhf", temperature=None, staleness_bound=None)

    assert "StuckReward" in {f.kind for f in evaluate(h, RunFacts(), Thresholds(), 1020.0)}
    assert not evaluate(h, external, Thresholds(), 1020.0)
    _, gaps = coverage(h, external)
    assert next(g for g in gaps if g.kind == "StuckReward").any_of == (
        M.SAMPLES_ZERO_STD_GROUP_FRAC, M.REWARD_STD)
