"""The compare page's what-if table: fitted from the first run compared, with every other
run's measured median samples/s and bubble set against its row of that table."""

import pytest

from engine.config import validate_config
from jobs.models import MetricPoint, Run, RunStatus

from .test_plan_table import DISAGGREGATED, store_steps

ONE_STEP_OFF = DISAGGREGATED | {"name": "async", "async_policy": {"type": "one_step_off"}}
# The first step is warm-up (left out, as the fit leaves it out); 32 prompts x 8 samples
# a step (the defaults, as the baseline's).
STEP_S = [50.0, 1.0, 2.0, 4.0, 0.5]          # -> 256, 128, 64, 512 samples/s: median 192
BUBBLE = [0.9, 0.1, 0.2, 0.4, 0.3]           # -> median 0.25


def stored(make_run, name: str, config: dict) -> Run:
    run = make_run(RunStatus.STOPPED, name=name)
    Run.objects.filter(pk=run.pk).update(config=validate_config(config).model_dump(mode="json"))
    run.refresh_from_db()
    return run


@pytest.fixture
def baseline(make_run):
    return stored(make_run, "baseline", DISAGGREGATED)


@pytest.fixture
def measured(make_run):
    run = stored(make_run, "async", ONE_STEP_OFF)
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, step=s, name=name, value=v)
        for s, (t, b) in enumerate(zip(STEP_S, BUBBLE, strict=True))
        for name, v in (("time/step_s", t), ("bubble", b)))
    return run


def test_the_compare_page_shows_the_baselines_table_and_each_runs_prediction_vs_measurement(
        client, operator, baseline, measured, make_run):
    store_steps(baseline, 5)
    elsewhere = stored(make_run, "in process", {"name": "t", "steps": 3})

    page = client.get(f"/runs/compare?ids={baseline.pk},{measured.pk},{elsewhere.pk}")

    assert page.status_code == 200
    html = page.content.decode()
    assert "What this run would do under each policy and placement" in html
    assert f"Fitted from the baseline, <a href=\"/runs/{baseline.pk}\">#{baseline.pk} " \
           "baseline</a>" in html
    [row] = [r for r in page.context["plan"].rows
             if (r.placement, r.policy) == ("disaggregated 1+1", "one_step_off")]
    check, other = page.context["plan_checks"]
    assert check.run == measured and check.row is row
    assert check.samples_per_s == pytest.approx(192.0) and check.bubble == pytest.approx(0.25)
    assert check.ratio == pytest.approx(row.samples_per_s / 192.0)
    assert f"{row.samples_per_s:.2f} / 192.00" in html and f"{row.bubble:.2f} / 0.25" in html
    assert f"<td>{row.samples_per_s / 192.0:.2f}</td>" in html
    assert other.row is None and ("No match: the baseline&#x27;s table has no row for "
                                  "colocated 1 (in process) under sync (it plans 2 devices)."
                                  in html)


def test_a_matching_run_without_timed_steps_says_so(client, operator, baseline, make_run):
    store_steps(baseline, 5)
    fresh = stored(make_run, "fresh", ONE_STEP_OFF)

    html = client.get(f"/runs/compare?ids={baseline.pk},{fresh.pk}").content.decode()

    assert "No match: it has no timed step yet." in html


def test_an_unplannable_baseline_says_why_instead_of_failing(client, operator, baseline,
                                                              measured):
    page = client.get(f"/runs/compare?ids={baseline.pk},{measured.pk}")

    assert page.status_code == 200
    html = page.content.decode()
    assert "No prediction: it has no timed step yet." in html
    assert f"#{baseline.pk} baseline</a> (the first run compared)" in html
    assert 'id="plan-checks"' not in html


def test_a_run_with_another_batch_is_not_set_against_the_baselines_prediction(
        client, operator, baseline, make_run):
    store_steps(baseline, 5)
    bigger = stored(make_run, "bigger", ONE_STEP_OFF | {"rollout": {"prompts_per_step": 64}})
    MetricPoint.objects.bulk_create(MetricPoint(run=bigger, step=s, name="time/step_s",
                                                value=1.0) for s in range(3))

    html = client.get(f"/runs/compare?ids={baseline.pk},{bigger.pk}").content.decode()

    assert ("No match: rollout.prompts_per_step is 64, the baseline&#x27;s 32: the "
            "prediction is for the baseline&#x27;s workload.") in html


def test_the_baseline_is_the_first_run_asked_for(client, operator, baseline, make_run):
    first = stored(make_run, "first", ONE_STEP_OFF)
    store_steps(first, 5)
    store_steps(baseline, 5)

    page = client.get(f"/runs/compare?ids={first.pk},{baseline.pk}")

    assert page.context["plan"].current.policy == "one_step_off"
    assert f"#{first.pk} first</a> (the first run compared)" in page.content.decode()
    [check] = page.context["plan_checks"]
    assert check.run == baseline and check.row.policy == "sync"
    assert check.samples_per_s == pytest.approx(32 * 8 / 1.0)  # the defaults; 1 s a step
    assert check.bubble is None                                # no bubble reported: "–"
    assert f"{check.row.bubble:.2f} / –" in page.content.decode()
