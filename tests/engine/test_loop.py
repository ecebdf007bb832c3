"""The sync loop end to end on the tiny model (random init, a few steps)."""

import json
import subprocess
import sys

import pytest

from engine.api import (
    CheckpointEvent,
    MetricsEvent,
    RunStatusEvent,
    SamplesEvent,
    SpanEvent,
    WeightSyncEvent,
    event_from_dict,
    run_local,
)
from engine.config import dump_config
from engine.telemetry.sinks import MemorySink, read_jsonl

from .conftest import small_run

CANONICAL = [
    "reward/mean", "reward/std", "response_length/mean", "response_length/p50",
    "response_length/p99", "response_length/max", "time/step_s", "time/rollout_s",
    "time/reward_s", "time/learner_s", "time/weight_sync_s", "time/idle_s", "rollout_share",
    "bubble", "throughput/tokens_per_s", "staleness/mean", "staleness/max",
    "logprob_gap/mean", "logprob_gap/max", "logprob_gap/k3", "tis/clip_frac",
    "weight_sync/latency_s", "weight_sync/bytes", "weight_sync/gb_per_s",
    "weight_sync/version_learner", "weight_sync/version_rollout", "learner/loss",
    "learner/grad_norm", "learner/kl_ref", "learner/entropy", "device/utilization/cpu:0",
    "device/cpu_util/cpu:0", "device/memory_gb/cpu:0",
]


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory, model_cache):
    out = tmp_path_factory.mktemp("run")
    sink = MemorySink()
    summary = run_local(small_run(), out, sink=sink)
    return summary, sink.events, out


def test_a_run_succeeds_and_emits_ordered_events(two_step_run):
    summary, events, _ = two_step_run
    assert summary.status == "succeeded" and summary.steps_done == 2
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(events) + 1))
    statuses = [e.status for e in events if isinstance(e, RunStatusEvent)]
    assert statuses == ["starting", "warm_start", "running", "succeeded"]
    assert events[-1].message == "trained all 2 steps"   # the page's and API's reason


def test_every_step_reports_the_canonical_metrics(two_step_run):
    _, events, _ = two_step_run
    steps = [e for e in events if isinstance(e, MetricsEvent) and "reward/mean" in e.values]
    assert [e.step for e in steps] == [0, 1]
    for e in steps:
        missing = [k for k in CANONICAL if k not in e.values]
        assert not missing
        v = e.values
        assert v["staleness/max"] == 0                       # sync loop
        assert 0 < v["rollout_share"] < 1 and 0 <= v["bubble"] < 0.2
        assert v["logprob_gap/max"] < 1e-4                   # same weights, fp32
        assert v["device/cpu_util/cpu:0"] > 0 and v["device/memory_gb/cpu:0"] > 0.05
        assert v["weight_sync/version_learner"] == v["weight_sync/version_rollout"] == e.step + 1
        phases = sum(v[f"time/{p}_s"] for p in ("rollout", "reward", "learner", "weight_sync"))
        assert phases <= v["time/step_s"] + 1e-6


def test_spans_cover_every_phase_of_every_step(two_step_run):
    _, events, _ = two_step_run
    spans = [e for e in events if isinstance(e, SpanEvent)]
    for step in (0, 1):
        phases = {s.phase for s in spans if s.step == step}
        assert phases == {"rollout", "reward", "learner", "weight_sync"}
    assert all(s.end >= s.start and s.device == "cpu:0" for s in spans)


def test_every_sync_reports_matching_fingerprints(two_step_run):
    _, events, _ = two_step_run
    syncs = [e for e in events if isinstance(e, WeightSyncEvent)]
    assert [s.version_learner for s in syncs] == [0, 1, 2]
    assert all(s.matched and s.fingerprint_learner == s.fingerprint_rollout for s in syncs)


def test_the_jsonl_file_holds_the_same_events(two_step_run):
    _, events, out = two_step_run
    on_disk = read_jsonl(out / "events.jsonl")
    assert [e.to_dict() for e in on_disk] == [e.to_dict() for e in events]
    line = json.loads((out / "events.jsonl").read_text().splitlines()[0])
    assert line["type"] == "run.status" and event_from_dict(line).seq == 1


def test_the_run_directory_has_its_config_and_a_final_checkpoint(two_step_run):
    _, _, out = two_step_run
    assert (out / "config.toml").read_text() == dump_config(small_run())
    ckpt = out / "checkpoints" / "step_000002"
    saved = [e for e in two_step_run[1] if isinstance(e, CheckpointEvent)]
    assert [(e.step, e.path) for e in saved] == [(2, str(ckpt))]
    for f in ("model.safetensors", "config.json", "tokenizer.json", "optimizer.pt", "state.json"):
        assert (ckpt / f).exists(), f


def test_the_cli_rejects_a_bad_config_naming_the_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[rollout]\ntemperature = 9\n")
    proc = subprocess.run([sys.executable, "-m", "engine", "run", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "rollout.temperature" in proc.stderr


@pytest.mark.slow
def test_the_cli_runs_a_config_and_prints_a_summary(tmp_path, model_cache):
    cfg = tmp_path / "c.toml"
    cfg.write_text(dump_config(small_run(steps=1)))
    proc = subprocess.run([sys.executable, "-m", "engine", "run", str(cfg), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "succeeded after 1 steps" in proc.stdout
    assert "eval/reward_mean" in proc.stdout


def test_a_stop_file_checkpoints_after_the_step_in_progress(tmp_path, model_cache):
    (tmp_path / "STOP").touch()
    sink = MemorySink()
    summary = run_local(small_run(steps=5), tmp_path, sink=sink)
    assert summary.status == "stopped" and summary.steps_done == 1
    assert (tmp_path / "checkpoints" / "step_000001" / "state.json").exists()
    assert sink.events[-1].message == "stopped on request after step 1 of 5"


def test_a_run_out_of_time_says_max_seconds_in_its_final_status(tmp_path, model_cache):
    sink = MemorySink()
    summary = run_local(small_run(steps=5, max_seconds=1e-6, task={"eval_size": 8}), tmp_path,
                        sink=sink)
    assert summary.status == "succeeded" and summary.steps_done == 1
    assert sink.events[-1].message == "max_seconds=1e-06 reached after step 1 of 5"


def test_every_step_emits_a_sample_of_its_rollouts_for_the_inspector(two_step_run):
    _, events, _ = two_step_run
    metrics = {e.step: e.values for e in events
               if isinstance(e, MetricsEvent) and "reward/mean" in e.values}
    sampled = [e for e in events if isinstance(e, SamplesEvent)]
    assert [e.step for e in sampled] == [0, 1]
    for event in sampled:
        samples = event.samples
        # telemetry.sample_groups = 2 (the default) whole groups of group_size = 4
        assert [s.group for s in samples] == [0] * 4 + [1] * 4
        for group in (samples[:4], samples[4:]):
            assert len({s.prompt for s in group}) == 1 and group[0].prompt.strip()
            assert abs(sum(s.advantage for s in group)) < 1e-4   # group-relative
        for s in samples:
            assert s.reason and s.staleness == 0 and s.version == s.last_version
            assert s.length == len(s.tokens) == len(s.behaviour_logprobs) \
                == len(s.learner_logprobs)
            special = {"<pad>", "<bos>", "<eos>", "<unk>"}    # shown as tokens, not in the text
            assert "".join(t for t in s.tokens if t not in special) == s.completion
            assert not s.truncated or s.length == 4               # rollout.max_new_tokens
            # the learner's recompute is the one the step's logprob_gap/max is measured on
            gaps = [abs(b - learner) for b, learner in
                    zip(s.behaviour_logprobs, s.learner_logprobs, strict=True)]
            assert max(gaps, default=0.0) <= metrics[event.step]["logprob_gap/max"] + 1e-3
            assert all(b <= 0 for b in s.behaviour_logprobs)

