"""The alert rules on hand-made histories: each fires on its condition, names the cause,
and stays quiet on a healthy history."""

import pytest

from engine.config import validate_config
from jobs.alerts.history import RunFacts, RunHistory, Thresholds
from jobs.alerts.rules import KINDS, RULES, evaluate, slope

FACTS = RunFacts(temperature=0.7)


def healthy(steps: int = 6, **per_step) -> RunHistory:
    """A sync run's events: spans, a matched sync, then the step's metrics. ``per_step``
    maps a metric (or "fp_rollout", "version_rollout", "version_learner", "phase:<p>")
    to a function of the step that overrides the healthy value."""
    h, t, seq = RunHistory(), 1000.0, 0

    def add(**e):
        nonlocal seq
        seq += 1
        h.add({"seq": seq, "ts": t, **e})

    for step in range(steps):
        for phase, dur in (("rollout", 0.5), ("reward", 0.01), ("learner", 0.4),
                           ("weight_sync", 0.05)):
            dur = per_step.get(f"phase:{phase}", lambda s, d=dur: d)(step)
            add(type="span", device="cpu:0", phase=phase, start=t, end=t + dur, step=step,
                version=step)
            t += dur
        v = per_step.get("version_learner", lambda s: s + 1)(step)
        rollout_v = per_step.get("version_rollout", lambda s, v=v: v)(step)
        rollout_fp = per_step.get("fp_rollout", lambda s, v=v: f"fp{v}")(step)
        add(type="weight_sync.report", step=step, version_learner=v, version_rollout=rollout_v,
            fingerprint_learner=f"fp{v}", fingerprint_rollout=rollout_fp,
            matched=(rollout_v, rollout_fp) == (v, f"fp{v}"), latency_s=0.05, bytes=1)
        values = {"reward/mean": 0.1 * step, "logprob_gap/mean": 0.0,
                  "logprob_gap/untempered_mean": 0.15, "staleness/max": 0.0,
                  "staleness/mean": 0.0, "weight_sync/version_learner": float(v),
                  "weight_sync/latency_s": 0.05, "rollout_share": 0.5, "bubble": 0.01,
                  "reward/std": 0.0, "time/step_s": 1.0, "time/reward_s": 0.01,
                  "time/rollout_s": 0.5}
        if "samples/zero_std_group_frac" in per_step:      # a run that logs it
            values["samples/zero_std_group_frac"] = 0.0
        for name, fn in per_step.items():
            if name in values:
                values[name] = fn(step)
        add(type="metrics.append", step=step, values=values)
    return h


def kinds(h, facts=FACTS, t=None, now=None) -> set[str]:
    return {f.kind for f in evaluate(h, facts, t or Thresholds(), now or h.last_ts)}


def test_every_rule_has_a_kind_and_a_healthy_history_raises_nothing():
    assert len(RULES) == len(KINDS) == 23
    assert kinds(healthy(30)) == set()


def test_a_fingerprint_mismatch_at_the_same_version_is_a_desync():
    h = healthy(fp_rollout=lambda s: "fp1" if s >= 3 else f"fp{s + 1}")
    [f] = [f for f in evaluate(h, FACTS, Thresholds(), h.last_ts) if f.kind == "WeightSyncDesync"]
    assert "not receiving new weights" in f.cause and f.step == 3    # since when
    assert f.evidence["values"]["fingerprint_rollout"] == "fp1"


def test_a_rollout_version_lagging_by_more_than_k_is_a_desync():
    h = healthy(version_rollout=lambda s: 1)
    assert "WeightSyncDesync" in kinds(h)
    assert "WeightSyncDesync" not in kinds(h, t=Thresholds(desync_version_lag=10))


@pytest.mark.parametrize(("overrides", "diagnosis"), [
    ({"fp_rollout": lambda s: "fp1"}, "the generator is not receiving new weights"),
    ({"logprob_gap/mean": lambda s: 0.5}, "the behaviour policy differs from the learner"),
    ({}, "learning signal is flat (check reward variance / advantages)"),
])
def test_stuck_reward_names_one_of_three_diagnoses(overrides, diagnosis):
    h = healthy(25, **{"reward/mean": lambda s: 0.3}, **overrides)
    [f] = [f for f in evaluate(h, FACTS, Thresholds(), h.last_ts) if f.kind == "StuckReward"]
    assert diagnosis in f.cause
    assert len(f.evidence["series"]["values"]) == 25


def test_a_path_models_flat_signal_names_its_warm_start_and_learning_rate_first(tmp_path):
    cfg = validate_config({"model": {"path": str(tmp_path)}, "algorithm": {"lr": 3e-4}},
                          check_files=False)
    h = healthy(25, **{"reward/mean": lambda s: -0.1})
    [f] = [f for f in evaluate(h, RunFacts(temperature=0.7, config=cfg), Thresholds(),
                               h.last_ts) if f.kind == "StuckReward"]
    assert "warm_start.steps (now 0)" in f.runbook and "algorithm.lr (now 0.0003" in f.runbook
    [built_in] = [f for f in evaluate(h, FACTS, Thresholds(), h.last_ts)
                  if f.kind == "StuckReward"]
    assert "model.path" not in built_in.runbook


def test_a_flat_reward_that_still_varies_is_slow_learning_not_stuck():
    h = healthy(25, **{"reward/mean": lambda s: 0.3, "reward/std": lambda s: 0.4})
    assert "StuckReward" not in kinds(h)


def test_the_flat_signal_diagnosis_reads_the_share_of_groups_whose_rewards_agree():
    # reward/std says the batch varies (across groups), but within nearly every group the
    # rewards agree: no advantage, no signal
    flat = healthy(25, **{"reward/mean": lambda s: 0.3, "reward/std": lambda s: 0.4,
                          "samples/zero_std_group_frac": lambda s: 0.9})
    [f] = [f for f in evaluate(flat, FACTS, Thresholds(), flat.last_ts)
           if f.kind == "StuckReward"]
    assert "learning signal is flat" in f.cause and "dynamic_sampling" in f.runbook
    assert f.evidence["values"]["zero_std_group_frac"] == pytest.approx(0.9)
    varied = healthy(25, **{"reward/mean": lambda s: 0.3, "reward/std": lambda s: 0.0,
                            "samples/zero_std_group_frac": lambda s: 0.5})
    assert "StuckReward" not in kinds(varied)
    assert "StuckReward" in kinds(varied, t=Thresholds(stuck_zero_std_frac=0.5))


def test_a_gap_that_matches_the_untempered_distribution_is_a_temperature_bug():
    h = healthy(**{"logprob_gap/mean": lambda s: 0.15 if s >= 4 else 0.0,
                   "logprob_gap/untempered_mean": lambda s: 0.0 if s >= 4 else 0.15})
    assert {"TemperatureLogprobs"} <= kinds(h)
    assert "LogprobGapHigh" not in kinds(h)          # the specific cause wins
    assert "TemperatureLogprobs" not in kinds(h, facts=RunFacts(temperature=1.0))


def test_a_high_gap_that_is_not_untempered_is_logprob_gap_high():
    h = healthy(**{"logprob_gap/mean": lambda s: 0.4})
    assert kinds(h) == {"LogprobGapHigh"}


def test_a_gap_rising_while_the_weights_stay_put_is_drift():
    def same_version(s):
        return 7

    h = healthy(8, version_learner=same_version,
                **{"logprob_gap/mean": lambda s: 0.001 + 0.004 * s})
    assert "LogprobGapDrift" in kinds(h)
    h = healthy(8, **{"logprob_gap/mean": lambda s: 0.001 + 0.004 * s})
    assert "LogprobGapDrift" not in kinds(h)          # the weights changed: not drift


def test_staleness_over_the_policy_bound():
    h = healthy(**{"staleness/max": lambda s: 2.0})
    assert "StalenessOverBound" in kinds(h)
    assert "StalenessOverBound" not in kinds(h, facts=RunFacts(staleness_bound=2))


def test_a_version_going_backwards_or_negative_staleness_is_a_regression():
    h = healthy(version_learner=lambda s: 1 if s == 5 else s + 1)
    assert "VersionRegression" in kinds(h)
    assert "VersionRegression" in kinds(healthy(**{"staleness/mean": lambda s: -1.0}))


def test_phase_hang_names_the_phase_and_device_after_k_times_its_median():
    h = healthy(6)
    last_end = max(s.end for s in h.spans)
    t = Thresholds(hang_factor=10, hang_min_s=1.0)
    # The last thing that happened was the weight sync: the run is waiting on rollout
    # (median 0.5 s); 10x is 5 s.
    assert "PhaseHang" not in kinds(h, t=t, now=last_end + 4.9)
    [f] = [f for f in evaluate(h, FACTS, t, last_end + 5.1) if f.kind == "PhaseHang"]
    assert f.cause.startswith("Stuck in rollout on cpu:0")
    assert "PhaseHang" not in kinds(h, facts=RunFacts(status="succeeded"), t=t,
                                    now=last_end + 60)


def test_bubble_high_needs_the_condition_for_the_whole_window_and_names_the_fix():
    h = healthy(**{"rollout_share": lambda s: 0.95 if s >= 4 else 0.5})
    [f] = [f for f in evaluate(h, FACTS, Thresholds(), h.last_ts) if f.kind == "BubbleHigh"]
    assert 'async_policy.type = "one_step_off"' in f.runbook and "partial rollout" in f.runbook
    assert f.runbook.index("placement.ray = true") < f.runbook.index("one_step_off")  # in process
    h = healthy(**{"rollout_share": lambda s: 0.95 if s == 5 else 0.5})
    assert "BubbleHigh" not in kinds(h)
    h = healthy(**{"time/reward_s": lambda s: 0.95})
    assert "the reward stage takes" in evaluate(h, FACTS, Thresholds(), h.last_ts)[0].cause


def test_resync_slow_against_the_runs_own_median():
    h = healthy(**{"weight_sync/latency_s": lambda s: 3.0 if s == 5 else 0.05})
    [f] = evaluate(h, FACTS, Thresholds(), h.last_ts)
    assert f.kind == "ResyncSlow" and "weight_sync/gb_per_s" in f.runbook  # a real metric
    h = healthy(**{"weight_sync/latency_s": lambda s: 0.5 if s == 5 else 0.05})
    assert kinds(h) == set()                       # 10x, but under resync_min_s


def test_a_lost_run_raises_run_lost():
    assert kinds(healthy(), facts=RunFacts(status="lost")) == {"RunLost"}


def test_a_restarted_driver_raises_its_notice_until_the_resumed_one_trains_past_its_step():
    restart = {"cause": "the run's driver was killed (SIGKILL)", "job": "rlplane-run-7",
               "step": 5, "at": "2026-12-03T16:00:00+00:00"}
    facts = RunFacts(temperature=0.7, restarts=(restart,), max_restarts=1)

    [f] = [f for f in evaluate(healthy(6), facts, Thresholds(), 0) if f.kind ==
           "DriverRestarted"]              # steps 0-5 stored: the resumed one is not past 5
    assert f.key == "DriverRestarted-1" and f.step == 5
    assert "after step 5 (the run's driver was killed (SIGKILL))" in f.cause
    assert "restart 1 of 1" in f.cause and "rlplane-run-7" in f.runbook
    assert "DriverRestarted" not in kinds(healthy(7), facts)       # step 6: cleared


def test_slope_is_least_squares():
    assert slope([(0, 1.0), (1, 3.0), (2, 5.0)]) == pytest.approx(2.0)


def test_generation_time_far_over_the_runs_median_is_a_straggler_bubble():
    h = healthy(**{"time/rollout_s": lambda s: 20.0 if s >= 4 else 0.5})
    [f] = [f for f in evaluate(h, FACTS, Thresholds(), h.last_ts) if f.kind == "BubbleHigh"]
    assert "stragglers hold every batch" in f.cause and "partial rollout" in f.runbook
    h = healthy(**{"time/rollout_s": lambda s: 4.0 if s >= 4 else 0.5})
    assert "BubbleHigh" not in kinds(h)                # 8x, under straggler_min_s


def _unverified_after(h: RunHistory, first: int, last: int, mismatch_at: int | None = None):
    """Syncs ``first``..``last`` as weight_sync.verify_every > 1 reports them: no
    fingerprints (both ""), versions only; ``mismatch_at`` is a verified one that differs."""
    for step in range(first, last + 1):
        verified = step == mismatch_at
        h.add({"seq": 10_000 + step, "ts": h.last_ts + 1, "type": "weight_sync.report",
               "step": step, "version_learner": step + 1, "version_rollout": step + 1,
               "fingerprint_learner": f"fp{step + 1}" if verified else "",
               "fingerprint_rollout": "fp1" if verified else "", "matched": not verified,
               "latency_s": 0.05, "bytes": 1, "verified": verified})


def test_unverified_syncs_are_not_read_as_a_desync():
    h = healthy(6)
    _unverified_after(h, 6, 12)
    assert h.syncs[-1].verified is False and h.syncs[-1].fingerprint_rollout == ""
    assert "WeightSyncDesync" not in kinds(h)


def test_unverified_syncs_do_not_clear_a_desync_the_last_verified_sync_found():
    h = healthy(6)
    _unverified_after(h, 6, 10, mismatch_at=7)
    [f] = [f for f in evaluate(h, FACTS, Thresholds(), h.last_ts) if f.kind == "WeightSyncDesync"]
    assert f.step == 7 and "were not verified" in f.cause
    assert f.evidence["values"]["fingerprint_rollout"] == "fp1"


def test_a_real_session_with_verify_every_keeps_the_desync_rule_quiet_until_a_verified_mismatch(
        tmp_path):
    """The events a WeightSyncSession emits with weight_sync.verify_every = 3: the
    unverified syncs raise nothing; a worker that stops loading is caught at the next
    verified sync."""
    from engine.config import validate_config
    from engine.orchestration.actors import LocalActor
    from engine.weightsync.session import EngineHost, TensorSource, WeightSyncSession
    from tests.engine.test_delta_sync import _step, _Tensors, _weights

    class Stops(_Tensors):           # from version 4 on: takes the version, not the tensors
        def load_weights(self, named, version, verify=True):
            return super().load_weights(named if version < 4 else [], version, verify)

    cfg = validate_config({"weight_sync": {"type": "shm", "directory": str(tmp_path),
                                           "verify_every": 3}}).weight_sync
    named = _weights()
    source = TensorSource(named, 0)
    session = WeightSyncSession(LocalActor(source), [LocalActor(EngineHost(Stops(named)))], cfg)
    session.connect()
    h, firing = RunHistory(), []
    for version in range(8):
        source.named, source.version = _step(named, version), version
        session.send(version, initial=version == 0)
        [res] = session.settle(wait=True)
        h.add({"seq": version + 1, "ts": 1000.0 + version, **res.event().to_dict()})
        firing.append("WeightSyncDesync" in kinds(h))
    assert [s.verified for s in h.syncs] == [True, False, False, True, False, False, True, False]
    # v4, v5 are unverified (versions agree): quiet; v6 is verified and differs: fires, and
    # the unverified v7 after it does not clear it
    assert firing == [False] * 6 + [True, True]
    session.learner.obj.close_sender()


# --------------------------------------------------------------------------- advice that fits

def async_facts(**async_policy) -> RunFacts:
    cfg = validate_config({
        "placement": {"type": "disaggregated", "rollout_workers": 1},
        "async_policy": {"type": "fully_async", **async_policy},
        "weight_sync": {"type": "shm"}, "rollout": {"temperature": 0.7}})
    return RunFacts.from_config(cfg, "running")


def fully_async(steps: int = 8, gen_s=lambda s: (0.3, 0.35), sync_gap=lambda s: 0.0,
                receive_s=lambda s: 0.05, rollout_share=0.99, bubble=0.05) -> RunHistory:
    """A fully-async disaggregated run as its events arrive: the rollout worker (gpu:0)
    generates continuously, the learner (gpu:1) trains, and each step's sync is sent at
    the learner's end of step. ``sync_gap(step)``: how long the worker's call in flight
    still runs after the send; ``receive_s(step)``: the receive's own length;
    ``gen_s(step)``: the step's samples' (p50, p99) generation time."""
    h, seq, t = RunHistory(), 0, 1000.0

    def add(**e):
        nonlocal seq
        seq += 1
        h.add({"seq": seq, "ts": e.get("end", t), **e})

    for step in range(steps):
        learn_end = t + 1.0
        add(type="span", device="gpu:1", phase="learner", start=t, end=learn_end, step=step,
            version=step)
        sent = learn_end
        add(type="span", device="gpu:1", phase="weight_sync", start=sent, end=sent + 0.02,
            step=step, version=step + 1)
        gen_end = sent + sync_gap(step)
        add(type="span", device="gpu:0", phase="rollout", start=t - 0.5, end=gen_end,
            step=step, version=step)
        served = gen_end + receive_s(step)
        add(type="span", device="gpu:0", phase="weight_sync", start=gen_end, end=served,
            step=step, version=step + 1)
        latency = served - sent
        add(type="weight_sync.report", step=step, version_learner=step + 1,
            version_rollout=step + 1, fingerprint_learner=f"fp{step + 1}",
            fingerprint_rollout=f"fp{step + 1}", matched=True, latency_s=latency,
            bytes=2_000_000_000)
        p50, p99 = gen_s(step)
        add(type="metrics.append", step=step, values={
            "reward/mean": 0.1 * step, "reward/std": 0.3, "logprob_gap/mean": 0.0,
            "staleness/max": 1.0, "staleness/mean": 0.5, "time/step_s": 1.0,
            "time/rollout_s": 1.0, "time/reward_s": 0.01, "rollout_share": rollout_share,
            "bubble": bubble, "weight_sync/latency_s": latency,
            "weight_sync/version_learner": float(step + 1),
            "rollout/gen_s_p50": p50, "rollout/gen_s_p99": p99})
        t = max(served, learn_end) + 0.01
    return h


def finding(h, facts, kind):
    return next(f for f in evaluate(h, facts, Thresholds(), h.last_ts) if f.kind == kind)


def test_bubble_high_on_a_fully_async_run_does_not_recommend_fully_async():
    # generation on its own device taking the whole step is no alert by itself
    assert "BubbleHigh" not in kinds(fully_async(), facts=async_facts())
    f = finding(fully_async(bubble=0.45), async_facts(), "BubbleHigh")

    assert f.key == "BubbleHigh:bubble"
    assert "fully_async" not in f.runbook.split("Next levers")[1].replace(
        "fully_async policy", "")          # never told to go where it already is
    assert "one_step_off" not in f.runbook
    assert "async_policy.over_provision = 1.5 (now 1)" in f.runbook   # interruptible
    assert "async_policy.max_staleness 2 -> 3" in f.runbook
    assert "placement.rollout_workers 1 -> 2" in f.runbook
    # Already interruptible: the next step of the same lever, still not "fully async".
    f = finding(fully_async(bubble=0.45), async_facts(over_provision=2.0), "BubbleHigh")
    assert "over_provision 2 -> 3" in f.runbook and "(now 1)" not in f.runbook


def test_bubble_high_under_synchronous_partial_rollout_names_its_overlap():
    facts = async_facts(type="partial_rollout", overlap=False, max_staleness=1)
    f = finding(fully_async(bubble=0.45), facts, "BubbleHigh")
    assert "async_policy.overlap = true (with max_staleness >= 2; now 1)" in f.runbook
    f = finding(fully_async(bubble=0.45), async_facts(type="partial_rollout"), "BubbleHigh")
    assert "async_policy.overlap" not in f.runbook       # it overlaps already


def test_a_straggler_under_fully_async_is_named_as_stragglers():
    # From step 6 one generation of each batch takes 8 s; the step shares stay what fully
    # async makes them (generation is always running), so only the samples show it.
    h = fully_async(gen_s=lambda s: (0.3, 8.3) if s >= 6 else (0.3, 0.35))

    f = finding(h, async_facts(), "BubbleHigh")

    assert f.key == "BubbleHigh:straggler"
    assert "stragglers hold every batch" in f.cause and "8.3+ s" in f.cause
    assert "median sample takes 0.30 s" in f.cause
    assert "interruptible generation" in f.runbook and "fully_async\"" not in f.runbook
    assert f.evidence["series"]["name"] == "rollout/gen_s_p99"
    # Before the window holds (one slow step), nothing: generation on its own device
    # filling the step is what it is for, and the devices are busy (bubble 0.05).
    h = fully_async(steps=7, gen_s=lambda s: (0.3, 8.3) if s >= 6 else (0.3, 0.35))
    assert "BubbleHigh" not in kinds(h, facts=async_facts())


def test_resync_slow_names_waiting_for_generation_apart_from_a_slow_transport():
    # The worker was 7.5 s into a straggling generation when the weights were sent: the
    # transport itself took 0.05 s.
    waited = fully_async(sync_gap=lambda s: 7.5 if s == 7 else 0.0)
    f = finding(waited, async_facts(), "ResyncSlow")

    assert f.key == "ResyncSlow:generation"
    assert "waited for in-flight generation" in f.cause and "gpu:0" in f.cause
    assert "the transport itself moved 2 GB in 0.05 s (40 GB/s)" in f.cause
    assert "The transport is not the cause" in f.runbook
    assert "Check the transport" not in f.runbook
    assert f.evidence["values"]["generation_wait_s"] == pytest.approx(7.5)

    # The same latency spent inside the receive: the transport was slow.
    slow = fully_async(receive_s=lambda s: 7.55 if s == 7 else 0.05)
    f = finding(slow, async_facts(), "ResyncSlow")

    assert f.key == "ResyncSlow:transport"
    assert "the transport was slow: 2 GB in 7.5 s (0.265 GB/s)" in f.cause
    assert "waited for in-flight generation" not in f.cause
    assert "weight_sync.type = 'shm'" in f.runbook


def test_runbooks_name_the_runs_own_settings():
    facts = async_facts(max_staleness=3)
    desync = healthy(**{"fp_rollout": lambda s: "old"})
    f = finding(desync, facts, "WeightSyncDesync")
    assert "weight_sync.type (now 'shm')" in f.runbook

    stale = healthy(**{"staleness/max": lambda s: 5.0 if s == 5 else 0.0})
    assert "async_policy.max_staleness (now 3)" in finding(stale, facts,
                                                           "StalenessOverBound").runbook
    sync_run = finding(stale, FACTS, "StalenessOverBound").runbook
    assert "max_staleness" not in sync_run and "rollout.prompts_per_step (now 32)" in sync_run


def with_sides(h: RunHistory, rollout: float, learner: float) -> RunHistory:
    """Per-device utilization as the engine reports it: gpu:0 generates, gpu:1 trains."""
    for s in h.steps:
        for d, phase, busy in (("gpu:0", "rollout", rollout), ("gpu:1", "learner", learner)):
            h.metrics.setdefault(f"device/utilization/{d}", {})[s] = busy
            h.metrics.setdefault(f"device/utilization/{d}/{phase}", {})[s] = busy
    return h


def test_a_disaggregated_bubble_names_the_side_that_waits():
    # The learner is the slow side: the rollout device idles, and more rollout workers
    # would idle more; the levers are the learner's.
    learner_bound = with_sides(fully_async(bubble=0.4), rollout=0.25, learner=0.95)
    f = finding(learner_bound, async_facts(), "BubbleHigh")
    assert f.key == "BubbleHigh:bubble"
    assert "The generator waits for the learner: rollout devices busy 25%" in f.runbook
    assert "placement.learner_devices 1 -> 2" in f.runbook
    assert "algorithm.minibatches 2 -> 1" in f.runbook        # the default is 2
    assert "rollout_workers 1 -> 2" not in f.runbook
    # Generation is the slow side: the learner idles; the generation levers as before.
    gen_bound = with_sides(fully_async(bubble=0.4), rollout=0.95, learner=0.25)
    f = finding(gen_bound, async_facts(), "BubbleHigh")
    assert "Devices wait for each other." in f.runbook
    assert "placement.rollout_workers 1 -> 2" in f.runbook
    assert "learner_devices" not in f.runbook


def test_bubble_high_leaves_out_the_first_step_where_an_async_pipeline_fills():
    # Steps 0 and 1 over the bound: step 0 is the fill (generation of the first batch
    # while the learner has nothing), so the 2-step window is not yet there.
    fill = fully_async(steps=2, bubble=0.45)
    assert "BubbleHigh" not in kinds(fill, facts=async_facts())
    held = fully_async(steps=3, bubble=0.45)     # steps 1 and 2: past the fill, it holds
    assert "BubbleHigh" in kinds(held, facts=async_facts())


@pytest.mark.parametrize("share, says", [
    ("idle", 'placement.overlap_share = "split"'),
    ("split", "placement.overlap_threads 1 -> 2 when the learner waits"),
])
def test_an_overlapped_thread_in_process_is_told_the_lever_its_sharing_has(share, says):
    from jobs.alerts.levers import next_levers

    cfg = validate_config({
        "placement": {"type": "colocated", "overlap_threads": 1, "overlap_share": share},
        "async_policy": {"type": "one_step_off"}})
    assert says in next_levers(cfg, "generation")[0]
