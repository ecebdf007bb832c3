"""The run page's health strip (jobs/alerts/health.py): a line per rule family with its
colour and the step its rules were last checked through, from what the last evaluation
stored (Run.rules_checked) and the run's live alerts; and the page's form that marks
ThroughputRegression's baseline run."""

from jobs.alerts.coverage import checked
from jobs.alerts.health import FAMILIES, family_of, strip
from jobs.alerts.history import RunFacts, RunHistory
from jobs.alerts.rules import KINDS
from jobs.models import Alert, AlertState


def lines_by_family(rules_checked, alerts=(), kinds=KINDS):
    return {line.family: line for line in strip(rules_checked, alerts, kinds)}


def test_every_rule_has_a_family_and_a_rule_it_does_not_know_gets_a_line_of_its_own():
    assert {family_of(kind) for kind in KINDS} <= set(FAMILIES)
    assert family_of("ThroughputRegression") == "throughput"
    assert family_of("EntropyCollapse") == "outputs" and family_of("BubbleHigh") == "systems"
    assert family_of("DataIntegrity") == "data"            # named ahead of its rule

    lines = lines_by_family({"BubbleHigh": 7, "SomethingNew": 7},
                            kinds=["BubbleHigh", "SomethingNew"])
    assert list(lines) == [*FAMILIES, "other"]
    assert lines["other"].checked == ("SomethingNew",) and lines["other"].colour == "green"
    data = lines["data"]                                    # a family with no rule yet
    assert (data.colour, data.step, data.total) == ("grey", None, 0)


def test_colours_say_what_holds_and_the_step_what_was_checked():
    kinds = ["StuckReward", "BubbleHigh", "ResyncSlow", "EntropyCollapse",
             "LengthBlowup", "ThroughputRegression"]
    lines = lines_by_family(
        {"StuckReward": 40, "BubbleHigh": 41, "EntropyCollapse": 41, "LengthBlowup": 41,
         "ThroughputRegression": 41},
        [("BubbleHigh", AlertState.OPEN), ("LengthBlowup", AlertState.ACKNOWLEDGED)], kinds)

    systems = lines["systems"]
    assert (systems.colour, systems.step, systems.firing) == ("red", 41, ("BubbleHigh",))
    assert systems.unchecked == ("ResyncSlow",) and systems.total == 3
    outputs = lines["outputs"]
    assert (outputs.colour, outputs.acknowledged) == ("amber", ("LengthBlowup",))
    assert (lines["throughput"].colour, lines["throughput"].step) == ("green", 41)
    # open and acknowledged at once (a new alert after an old one): red wins
    both = lines_by_family({"BubbleHigh": 3}, [("BubbleHigh", "acknowledged"),
                                               ("BubbleHigh", "open")], ["BubbleHigh"])
    assert (both["systems"].colour, both["systems"].acknowledged) == ("red", ())
    # nothing checked yet: grey, whatever the family holds
    assert lines_by_family({}, (), kinds)["throughput"].colour == "grey"


def test_checked_gives_each_fed_rule_the_step_all_its_inputs_reached():
    h = RunHistory()
    h.metrics = {"reward/mean": {0: 0.1, 1: 0.1, 2: 0.1}, "reward/std": {0: 0.1, 1: 0.1}}
    steps = checked(h, RunFacts())

    assert steps["StuckReward"] == 1           # reward/std stops at 1
    assert steps["RunLost"] == 2               # reads no metric: the history's last step
    assert "ThroughputRegression" not in steps and "EntropyCollapse" not in steps


def test_the_run_page_shows_the_strip_from_the_stored_evaluation(operator, make_run):
    run = make_run()
    run.rules_checked = {"BubbleHigh": 12, "ThroughputRegression": 11}
    run.save(update_fields=["rules_checked"])
    Alert.objects.create(run=run, kind="ThroughputRegression", dedup_key="t", cause="c",
                         runbook="r", step=11)

    html = operator.get(f"/runs/{run.pk}").content.decode()

    assert 'id="run-health"' in html
    assert 'data-family="throughput" data-colour="red"' in html
    assert 'data-family="systems" data-colour="green"' in html and "step 12" in html
    assert 'data-family="data" data-colour="grey"' in html


def test_the_run_page_marks_a_baseline_and_says_why_it_would_not(operator, make_run):
    from .test_alerts_outputs import stored_step

    run, timed = make_run(), make_run(name="timed")
    for step in range(3):
        stored_step(timed, step, 1.0)
    url = f"/runs/{run.pk}/baseline"

    page = operator.post(url, {"baseline_run": str(run.pk)}, follow=True).content.decode()
    assert f"Baseline not changed: run #{run.pk} cannot be its own baseline" in page
    page = operator.post(url, {"baseline_run": "x"}, follow=True).content.decode()
    assert "baseline_run must be a run id" in page
    page = operator.post(url, {"baseline_run": str(timed.pk)}, follow=True).content.decode()
    assert f'<a href="/runs/{timed.pk}">run #{timed.pk}</a> (marked)' in page
    operator.post(url, {"clear": "1"})
    run.refresh_from_db()
    assert run.baseline_run is None
