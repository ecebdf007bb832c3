"""The rules on what the policy writes and on throughput, on hand-made histories: each
fires on its condition with its cause, stays quiet on the healthy look-alike, and its
runbook lists only levers the run does not already pull."""

import dataclasses

import pytest

from engine.config import validate_config
from jobs.alerts.history import Baseline, RunFacts, RunHistory, Thresholds
from jobs.alerts.rules import evaluate

from .test_alerts_rules import healthy


def facts_of(**sections) -> RunFacts:
    return RunFacts.from_config(validate_config(sections), "running")


FACTS = facts_of(rollout={"temperature": 0.7, "max_new_tokens": 16})


def put(h: RunHistory, name: str, fn) -> RunHistory:
    """Metric ``name`` at every step of ``h``, fn(step)."""
    for s in h.steps:
        h.metrics.setdefault(name, {})[s] = fn(s)
    return h


def found(h: RunHistory, kind: str, facts: RunFacts = FACTS, t: Thresholds | None = None):
    return [f for f in evaluate(h, facts, t or Thresholds(), h.last_ts) if f.kind == kind]


# --------------------------------------------------------------------------- importance

def importance(ratio_mean=lambda s: 1.0, ess=lambda s: 0.8, ess_ratio=lambda s: 1.0):
    h = healthy(6)
    for name, fn in (("tis/ratio_mean", ratio_mean), ("tis/ess", ess),
                     ("tis/ess_ratio", ess_ratio), ("tis/ratio_min", lambda s: 0.5),
                     ("tis/ratio_p01", lambda s: 0.7)):
        put(h, name, fn)
    return h


def test_a_batch_down_weighted_by_its_importance_ratio_names_the_ratio():
    h = importance(ratio_mean=lambda s: 1 / 17 if s == 5 else 1.0)
    [f] = found(h, "ImportanceWeightCollapse")
    assert f.key == "ImportanceWeightCollapse:ratio" and f.step == 5
    assert "down-weighted 17x" in f.cause and "importance ratio" in f.cause
    # a sync, float32, torch run: no engine-logprob, dtype or staleness lever to list
    assert "does not help" in f.runbook and "model.dtype" not in f.runbook
    assert "async_policy" not in f.runbook and "logprobs_mode" not in f.runbook
    bf16 = facts_of(model={"dtype": "bfloat16"}, async_policy={"type": "one_step_off"})
    [f] = found(h, "ImportanceWeightCollapse", facts=bf16)
    assert "model.dtype 'bfloat16' -> \"float32\"" in f.runbook
    assert "async_policy.type 'one_step_off' -> \"sync\"" in f.runbook


def test_a_batch_carried_by_a_few_tokens_names_the_ratio_or_the_advantages():
    [ratio] = found(importance(ess=lambda s: 0.05, ess_ratio=lambda s: 0.2),
                    "ImportanceWeightCollapse")
    assert ratio.key.endswith(":ratio") and "counts as 5.0% of its tokens" in ratio.cause
    [adv] = found(importance(ess=lambda s: 0.05, ess_ratio=lambda s: 0.95),
                  "ImportanceWeightCollapse")
    assert adv.key.endswith(":advantage") and "the advantages are the cause" in adv.cause
    assert "algorithm.group_size 8 -> 16" in adv.runbook
    assert "dynamic_sampling = true" in adv.runbook
    dapo = facts_of(algorithm={"dynamic_sampling": True})
    [adv] = found(importance(ess=lambda s: 0.05), "ImportanceWeightCollapse", facts=dapo)
    assert "dynamic_sampling" not in adv.runbook          # already pulled


def test_a_healthy_batch_raises_no_importance_alert():
    assert found(importance(ratio_mean=lambda s: 0.97, ess=lambda s: 0.3),
                 "ImportanceWeightCollapse") == []


# --------------------------------------------------------------------------- entropy

def entropy_run(entropy, reward=lambda s: 0.3, flat=lambda s: 0.0, steps=6):
    h = healthy(steps, **{"reward/mean": reward, "samples/zero_std_group_frac": flat})
    return put(h, "learner/entropy", entropy)


def test_entropy_collapse_fires_while_the_reward_stalls_and_shows_both_series():
    [f] = found(entropy_run(lambda s: 0.9 if s < 4 else 0.02), "EntropyCollapse")
    assert f.step == 5 and "Policy entropy collapsed: 0.02" in f.cause
    assert f.evidence["series"]["name"] == "learner/entropy"
    assert f.evidence["compare"]["name"] == "reward/mean"
    assert "clip_eps_high 0.2 -> 0.28" in f.runbook and "kl_coef = 0.01 (now 0)" in f.runbook
    assert "before step 4" in f.runbook
    clip_higher = facts_of(algorithm={"clip_eps_high": 0.28, "kl_coef": 0.05})
    [f] = found(entropy_run(lambda s: 0.9 if s < 4 else 0.02), "EntropyCollapse",
                facts=clip_higher)
    assert "clip_eps_high" not in f.runbook and "kl_coef 0.05 -> 0.1" in f.runbook


def test_sharper_but_still_learning_is_no_collapse_unless_the_groups_all_agree():
    rising = lambda s: 0.2 if s < 4 else 0.8          # noqa: E731
    assert found(entropy_run(lambda s: 0.9 if s < 4 else 0.02, reward=rising),
                 "EntropyCollapse") == []
    assert found(entropy_run(lambda s: 0.9 if s < 4 else 0.02, reward=rising,
                             flat=lambda s: 0.0 if s < 4 else 1.0), "EntropyCollapse")


def test_entropy_that_falls_gently_for_one_step_or_on_a_solved_task_is_not_a_collapse():
    assert found(entropy_run(lambda s: 0.9 - 0.1 * s), "EntropyCollapse") == []
    assert found(entropy_run(lambda s: 0.02 if s == 5 else 0.9), "EntropyCollapse") == []
    solved = entropy_run(lambda s: 0.9 if s < 4 else 0.02, flat=lambda s: 1.0)
    put(solved, "reward/accuracy", lambda s: 0.5 if s < 4 else 1.0)
    assert found(solved, "EntropyCollapse") == []


# --------------------------------------------------------------------------- length

def lengths(truncated, p99=lambda s: 16.0, repetition=lambda s: 0.0, steps=6):
    h = healthy(steps)
    for name, fn in (("response/truncated_frac", truncated), ("response_length/p99", p99),
                     ("response/repetition", repetition),
                     ("response_length/mean", lambda s: 6.0)):
        put(h, name, fn)
    return h


def test_lengths_growing_into_the_cap_are_a_blowup_that_links_the_worst_step():
    h = lengths(lambda s: {4: 0.45, 5: 0.3}.get(s, 0.05))
    [f] = found(h, "LengthBlowup")
    assert "p99 length is 16 of rollout.max_new_tokens 16" in f.cause and "30% are cut" in f.cause
    assert f.evidence["samples"] == {"step": 4, "truncated": True,
                                     "why": "highest response/truncated_frac of the window"}
    assert 'overlong = {type = "penalty"}' in f.runbook
    assert "rollout.max_new_tokens 16 -> 32" in f.runbook
    assert found(h, "NonTermination") == []                       # most still stop
    penalized = facts_of(algorithm={"overlong": {"type": "penalty", "buffer_len": 2}})
    [f] = found(h, "LengthBlowup", facts=penalized)
    assert "penalty" not in f.runbook.split("Next levers")[1]


def test_a_run_that_always_truncated_or_stays_under_the_cap_raises_no_length_alert():
    assert found(lengths(lambda s: 0.6), "LengthBlowup") == []
    assert found(lengths(lambda s: 0.6), "NonTermination") == []
    assert found(lengths(lambda s: 0.05 if s < 4 else 0.5, p99=lambda s: 10.0),
                 "LengthBlowup") == []
    unknown_cap = RunFacts(temperature=0.7)
    assert found(lengths(lambda s: 0.05 if s < 4 else 0.5), "LengthBlowup",
                 facts=unknown_cap) == []


@pytest.mark.parametrize(("repetition", "key", "words"), [
    (0.8, "NonTermination:loops", "degenerate loops: 80% of their 4-token n-grams"),
    (0.1, "NonTermination:no_stop", "the stop token is not emitted"),
])
def test_completions_that_never_stop_name_loops_or_a_missing_stop(repetition, key, words):
    h = lengths(lambda s: 0.0 if s < 4 else 0.9,
                repetition=lambda s: repetition if s >= 4 else 0.0)
    [f] = found(h, "NonTermination")
    assert f.key == key and words in f.cause and "90% of step 5's" in f.cause
    assert f.evidence["samples"]["step"] in (4, 5)


# --------------------------------------------------------------------------- throughput

def timed(step_s, rollout_s=None, length=lambda s: 6.0, steps=8, samples=16):
    """A run whose step takes step_s(step) seconds, all of the change in rollout."""
    rollout_s = rollout_s or (lambda s: step_s(s) - 0.5)
    h = healthy(steps, **{"time/step_s": step_s, "time/rollout_s": rollout_s})
    put(h, "throughput/samples_per_s", lambda s: samples / step_s(s))
    put(h, "time/learner_s", lambda s: 0.4)
    return put(h, "response_length/mean", length)


def test_throughput_under_the_runs_first_steps_names_the_phase_that_slowed():
    h = timed(lambda s: 5.0 if s >= 6 else 1.0)
    [f] = found(h, "ThroughputRegression")
    assert f.step == 7 and "Throughput fell 80%: 3.2 samples/s" in f.cause
    assert "against 16 in steps 1-3 of this run" in f.cause
    assert "most of it in rollout (0.50 -> 4.50 s)" in f.cause
    assert f.evidence["values"]["phase"] == "rollout"
    assert '"partial_rollout"' in f.runbook           # a straggler's levers, for this run


def test_timing_noise_one_slow_step_longer_answers_or_resampling_are_no_regression():
    assert found(timed(lambda s: 3.5 if s >= 6 else 1.0), "ThroughputRegression") == []
    assert found(timed(lambda s: 5.0 if s == 7 else 1.0), "ThroughputRegression") == []
    longer = timed(lambda s: 5.0 if s >= 6 else 1.0,
                   length=lambda s: 30.0 if s >= 6 else 6.0)
    assert found(longer, "ThroughputRegression") == []
    # dynamic sampling drew 64 more samples a step for the groups it dropped: busier
    resampling = put(timed(lambda s: 5.0 if s >= 6 else 1.0), "samples/resampled",
                     lambda s: 64.0 if s >= 6 else 0.0)
    assert found(resampling, "ThroughputRegression") == []

    # on CPUs, every phase slower alike: the host's neighbours, not the run
    crowded = timed(lambda s: 5.0 if s >= 6 else 1.0, rollout_s=lambda s: 2.5 if s >= 6 else 0.5)
    put(crowded, "time/learner_s", lambda s: 2.0 if s >= 6 else 0.4)
    assert found(crowded, "ThroughputRegression") == []


PARENT = Baseline(samples_per_s=16.0, step_s=1.0,
                  phases={"time/rollout_s": 0.5, "time/learner_s": 0.4}, length=6.0,
                  source="run #7's steps 1-3")


def test_a_fork_is_judged_against_its_parents_baseline():
    fork = dataclasses.replace(FACTS, baseline=PARENT)
    slowed = timed(lambda s: 5.0)                     # slow from its first step on
    assert found(slowed, "ThroughputRegression") == []   # its own steps agree with themselves
    [f] = found(slowed, "ThroughputRegression", facts=fork)
    assert "against 16 in run #7's steps 1-3" in f.cause and "in rollout" in f.cause
    assert found(timed(lambda s: 1.1), "ThroughputRegression", facts=fork) == []


# --------------------------------------------------------------------------- on the database

def stored_step(run, step: int, step_s: float) -> None:
    from engine.api import MetricsEvent
    from jobs.models import RunEvent

    event = MetricsEvent(seq=step + 1, ts=1000.0 + step, step=step, values={
        "reward/mean": 0.1, "time/step_s": step_s, "time/rollout_s": step_s - 0.5,
        "throughput/samples_per_s": 16 / step_s, "response_length/mean": 6.0})
    RunEvent.objects.create(run=run, seq=event.seq, type=event.type, ts=event.ts,
                            payload=event.to_dict())


def test_a_fork_slower_than_its_parent_fires_against_the_parents_first_steps(make_run):
    from jobs.alerts.lifecycle import do_evaluate_alerts, stored_baseline

    parent = make_run(name="parent")
    for step in range(6):
        stored_step(parent, step, 1.0)
    slow, same = make_run(name="slow", parent=parent), make_run(name="same", parent=parent)
    for step in range(3):
        stored_step(slow, step, 5.0)
        stored_step(same, step, 1.1)

    base = stored_baseline(parent, Thresholds(), f"run #{parent.pk}'s")
    assert base.source == f"run #{parent.pk}'s steps 1-3" and base.step_s == 1.0
    [alert] = [a for a in do_evaluate_alerts(slow) if a.kind == "ThroughputRegression"]
    assert f"in run #{parent.pk}'s steps 1-3" in alert.cause and "in rollout" in alert.cause
    assert [a.kind for a in do_evaluate_alerts(same)] == []
    assert [a.kind for a in do_evaluate_alerts(parent)] == []   # against its own first steps


def test_a_baseline_an_operator_marks_comes_before_the_parents(make_run):
    from jobs.alerts.lifecycle import do_evaluate_alerts, do_set_baseline

    parent, fast = make_run(name="parent"), make_run(name="fast")
    for step in range(6):
        stored_step(parent, step, 5.0)     # as slow as the fork: no regression against it
        stored_step(fast, step, 1.0)
    fork = make_run(name="fork", parent=parent)
    for step in range(3):
        stored_step(fork, step, 5.0)
    def regressions():      # (its rollout takes 90 % of the step: BubbleHigh fires too)
        return [a for a in do_evaluate_alerts(fork) if a.kind == "ThroughputRegression"]
    assert regressions() == []

    do_set_baseline(None, fork, fast.pk)
    [alert] = regressions()

    source = f"the marked baseline, run #{fast.pk}'s steps 1-3"
    assert f"in {source}" in alert.cause and alert.evidence["values"]["baseline"] == source
    fork.refresh_from_db()
    assert fork.rules_checked["ThroughputRegression"] == 2    # what the health strip reads


def test_a_finding_about_samples_links_the_inspector_at_its_step(make_run):
    from jobs.alerts.history import Finding
    from jobs.alerts.lifecycle import do_apply_findings

    run = make_run()
    [alert] = do_apply_findings(run, [Finding(
        kind="LengthBlowup", key="LengthBlowup", cause="c", runbook="r", step=4,
        evidence={"samples": {"step": 4, "truncated": True}})])
    assert alert.evidence["samples"]["url"] == f"/runs/{run.pk}/samples?step=4&truncated=true"


def test_a_runs_own_baseline_is_read_until_its_first_steps_are_all_stored_then_kept(
        make_run, monkeypatch, django_capture_on_commit_callbacks):
    """An evaluation runs about once a batch: once the first steps a baseline may read are
    all stored, the process keeps it when the evaluation commits; an event stored out of
    order (history_rewrites) or other thresholds read it again."""
    from django.db.models import F

    from jobs.alerts import lifecycle
    from jobs.models import Run

    reads = []
    first_metrics = lifecycle.first_metrics
    monkeypatch.setattr(lifecycle, "first_metrics",
                        lambda run, t: reads.append(run.pk) or first_metrics(run, t))
    run, t = make_run(name="own"), Thresholds()
    rows = lifecycle.baseline_rows(t)
    for step in range(rows - 1):
        stored_step(run, step, 1.0)
    for _ in range(2):
        lifecycle.own_baseline(run, t)
    assert len(reads) == 2                          # not all there yet: read each time

    stored_step(run, rows - 1, 2.0)
    lifecycle.own_baseline(run, t)
    lifecycle.own_baseline(run, t)                  # that evaluation has not committed
    assert len(reads) == 4
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.own_baseline(run, t)
    kept = [lifecycle.own_baseline(run, t) for _ in range(3)]
    assert len(reads) == 5
    assert kept[0] == kept[2] == lifecycle.baseline_from(first_metrics(run, t), t,
                                                         "this run's") is not None

    Run.objects.filter(pk=run.pk).update(history_rewrites=F("history_rewrites") + 1)
    run.refresh_from_db()
    lifecycle.own_baseline(run, t)
    lifecycle.own_baseline(run, t.model_copy(update={"throughput_tolerance": 0.5}))
    assert len(reads) == 7
