"""DataIntegrity on hand-made histories: the data ledger's gap, repeat and restart each
fire with the counts, a healthy ledger (a resume's re-drawn steps included) stays quiet,
and the runbook names only levers the run uses."""

from engine.api import metrics as M
from jobs.alerts.history import RunHistory

from .test_alerts_outputs import facts_of, found, put
from .test_alerts_rules import healthy

N = 4   # prompts per step


def ledger_run(served=lambda s: N * (s + 1), skipped=lambda s: 0, repeated=lambda s: 0,
               steps=8) -> RunHistory:
    h = healthy(steps)
    put(h, M.DATA_SERVED, served)
    put(h, M.DATA_TRAINED, lambda s: N * (s + 1))
    put(h, M.DATA_DROPPED, lambda s: 0)
    put(h, M.DATA_EPOCH, lambda s: (N * (s + 1) - 1) // 10)
    put(h, M.DATA_SKIPPED, skipped)
    put(h, M.DATA_REPEATED, repeated)
    return h


def test_a_healthy_ledger_raises_nothing_even_where_a_resume_redrew_its_steps():
    assert found(ledger_run(), "DataIntegrity") == []
    # step 4 of the first run drew more ahead than the resumed run's step 5 had served
    assert found(ledger_run(served=lambda s: N * (s + 1) + (6 if s == 4 else 0)),
                 "DataIntegrity") == []


def test_a_resume_that_skips_prompts_fires_a_gap_with_the_counts():
    h = ledger_run(served=lambda s: N * (s + 1) + (0 if s < 4 else 3),
                   skipped=lambda s: 0 if s < 4 else 3)
    [f] = found(h, "DataIntegrity")
    assert f.key == "DataIntegrity:gap" and f.step == 4
    assert "3 training prompt(s) were passed over" in f.cause
    values = f.evidence["values"]
    assert values[M.DATA_SKIPPED] == 3 and values[M.DATA_SERVED] == N * 8 + 3
    assert values[M.DATA_TRAINED] == N * 8 and f.evidence["series"]["values"][-1] == 3
    assert "data.json" in f.runbook and "skip_on_resume" not in f.runbook
    rehearsed = facts_of(faults={"skip_on_resume": {"prompts": 3}})
    [f] = found(h, "DataIntegrity", facts=rehearsed)
    assert "faults.skip_on_resume (prompts = 3)" in f.runbook


def test_prompts_trained_twice_fire_a_repeat():
    [f] = found(ledger_run(repeated=lambda s: 0 if s < 6 else 2 * (s - 5)), "DataIntegrity")
    assert f.key == "DataIntegrity:repeat" and f.step == 6
    assert "4 training prompt(s) were served or trained again" in f.cause
    assert "staleness_overrun" not in f.runbook


def test_a_ledger_that_started_over_fires_a_restart():
    [f] = found(ledger_run(served=lambda s: N * (s + 1) if s < 5 else N * (s - 4)),
                "DataIntegrity")
    assert f.key == "DataIntegrity:restart" and f.step == 5
    assert f"{N:.0f} prompts served, where an earlier step had counted {5 * N}" in f.cause
