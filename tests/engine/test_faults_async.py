"""Faults on Ray: under fully async the rules name the cause the run's own config and
spans show, not the one a sync loop would suggest (one real run on logical GPUs); a
rollout worker SIGKILLed mid-run, and one whose sync wedges past weight_sync.timeout_s,
are replaced and the run finishes.

    rollout worker gpu:0   [gen ........ straggler 4 s][recv]     [gen ........ ][recv]
    learner        gpu:1        [learn][send ---- waits for the call ----->]
"""

import pytest

from engine.api import MetricsEvent, WeightSyncEvent, WorkerReplacedEvent, run_local
from engine.api import metrics as M
from engine.telemetry.sinks import MemorySink
from jobs.alerts.history import RunFacts, Thresholds

from .alert_watch import AlertWatch
from .conftest import small_run

pytestmark = pytest.mark.slow

ONSET = 2


def test_a_straggler_under_fully_async_is_named_and_its_resync_is_the_wait_not_the_transport(
        ray_gpus, tmp_path, model_cache):
    cfg = small_run(steps=ONSET + 5, warm_start={"steps": 0},
                    placement={"type": "disaggregated"}, weight_sync={"type": "object_store"},
                    async_policy={"type": "fully_async", "max_staleness": 2},
                    faults={"straggler": {"from_step": ONSET, "seconds": 4.0}})
    # A 4 s straggler against a 2 s floor (the default 5 s floor wanted 8 s, for 5 steps)
    watch = AlertWatch(RunFacts.from_config(cfg, "running"), Thresholds(straggler_min_s=2.0))

    summary = run_local(cfg, tmp_path, sink=watch)

    assert summary.status == "succeeded", summary
    fired = sorted({(step, f.key) for step, f in watch.fired})
    gen = {s: (round(v, 2), round(watch.history.metrics["rollout/gen_s_p99"][s], 2))
           for s, v in watch.history.series("rollout/gen_s_p50")}
    print(f"\nfired: {fired}\ngeneration p50, p99 per step: {gen}")
    straggler = next(((s, f) for s, f in watch.fired if f.key == "BubbleHigh:straggler"), None)
    assert straggler is not None, f"no straggler finding; fired: {fired}"
    step, f = straggler
    assert "stragglers hold every batch" in f.cause and ONSET <= step <= ONSET + 4
    assert 'async_policy.type = "fully_async"' not in f.runbook       # it already is
    assert "interruptible generation" in f.runbook
    print(f"BubbleHigh at step {step} (onset {ONSET}): {f.cause}\n  {f.runbook}")

    resync = watch.first("ResyncSlow")
    assert resync is not None, f"ResyncSlow never fired; fired: {fired}"
    step, f = resync
    assert f.key == "ResyncSlow:generation", f.cause
    assert "waited for in-flight generation" in f.cause
    assert "Check the transport" not in f.runbook
    values = f.evidence["values"]
    assert values["generation_wait_s"] >= 0.5 * values["latency_s"]
    print(f"ResyncSlow at step {step}: {f.cause}")
    assert not any(f.kind == "ResyncSlow" and f.key == "ResyncSlow:transport"
                   for _, f in watch.fired)


def test_a_slow_receive_under_fully_async_is_named_as_the_transport(ray_gpus, tmp_path,
                                                                    model_cache):
    # sync_hang blocks inside the worker's load of the new weights: the transport's share.
    cfg = small_run(steps=ONSET + 3, warm_start={"steps": 0},
                    placement={"type": "disaggregated"}, weight_sync={"type": "object_store"},
                    async_policy={"type": "fully_async", "max_staleness": 2},
                    faults={"sync_hang": {"at_step": ONSET, "seconds": 8.0}})
    watch = AlertWatch(RunFacts.from_config(cfg, "running"))

    summary = run_local(cfg, tmp_path, sink=watch)

    assert summary.status == "succeeded", summary
    fired = sorted({(step, f.key) for step, f in watch.fired})
    resync = watch.first("ResyncSlow")
    assert resync is not None, f"ResyncSlow never fired; fired: {fired}"
    step, f = resync
    assert f.key == "ResyncSlow:transport", f.cause
    assert "the transport was slow" in f.cause and "Check the transport" in f.runbook
    assert f.evidence["values"]["generation_wait_s"] < 0.5 * f.evidence["values"]["latency_s"]
    print(f"\nResyncSlow at step {step}: {f.cause}")


def test_a_killed_rollout_worker_and_a_wedged_sync_are_replaced_and_every_prompt_is_counted(
        ray_gpus, tmp_path, model_cache):
    # Step 1's generation call SIGKILLs the worker's process while it holds the step's
    # prompts (the sync policy draws new ones for its replacement); the sync that ends
    # step 2 wedges that replacement, and weight_sync.timeout_s cuts it off. Weight decay
    # moves every weight each step (a random-init policy's flat rewards give no gradient),
    # so a replacement serving its own starting weights would not match.
    cfg = small_run(steps=4, placement={"type": "disaggregated"},
                    algorithm={"weight_decay": 0.1},
                    weight_sync={"type": "object_store", "timeout_s": 5.0},
                    faults={"kill_rollout_worker": {"at_step": 1},
                            "sync_hang": {"at_step": 2, "seconds": 600.0}})
    sink = MemorySink()

    summary = run_local(cfg, tmp_path, sink=sink)

    assert (summary.status, summary.steps_done) == ("succeeded", 4), summary
    killed, wedged = sink.of_type(WorkerReplacedEvent)
    print(f"\nreplaced: {killed}\n{wedged}")
    assert (killed.step, killed.worker, killed.version, killed.replacements) == (1, 0, 1, 1)
    assert "died" in killed.cause
    assert (wedged.step, wedged.version, wedged.replacements) == (3, 3, 2)
    assert wedged.cause == "its weight sync ran past weight_sync.timeout_s = 5 s"
    for r in (killed, wedged):              # each serves the learner's weights, verified
        assert r.matched and r.fingerprint_worker == r.fingerprint_learner != ""
    syncs = sink.of_type(WeightSyncEvent)   # v3's was cut off: no worker ever served it
    assert [s.version_learner for s in syncs] == [0, 1, 2, 4]
    assert all(s.matched and s.verified for s in syncs)
    versions = [s.fingerprint_learner for s in syncs] + [wedged.fingerprint_learner]
    assert len(set(versions)) == 5 and killed.fingerprint_learner == syncs[1].fingerprint_learner
    last = [e.values for e in sink.of_type(MetricsEvent) if M.DATA_SERVED in e.values][-1]
    n = cfg.rollout.prompts_per_step
    assert last[M.DATA_DROPPED_BY.of(reason="error")] == n        # the killed worker's
    assert (last[M.DATA_SERVED], last[M.DATA_TRAINED], last[M.DATA_DROPPED]) == (5 * n, 4 * n, n)
