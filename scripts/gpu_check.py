"""The GPU checks behind scripts/gpu-check: one table, non-zero exit on a failure.

    check                                  on a GPU machine          on a CPU machine
    learner bf16 update, tiny / small      CUDA, 3 steps each        CPU, tiny only
    PPO critic + actor bf16 update, tiny   CUDA, 3 steps             CPU
    sampler vs learner logprobs (fp32)     CPU sampler, CUDA learner CPU both
    packed vs padded logprobs (fp32)       CUDA                      CPU
    cuda_ipc transport, 2 processes        spawned receiver          skipped (no CUDA)
    NVML sampling                          DeviceSampler on GPU 0    skipped, CPU sampling
    FSDP2 ShardedLearner, 2 processes      NCCL where >1 GPU         gloo

Needs torch and this project's engine only: no Ray, vLLM or Django is imported (the
engine modules used here import none of them). The torch sampler runs on the CPU (it has
no device choice), which makes the logprob check a cross-device one on a GPU machine.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import (  # noqa: E402
    ArithmeticTaskConfig,
    GrpoConfig,
    LearnerConfig,
    LongTailTaskConfig,
    PpoConfig,
)
from engine.experience import Sample  # noqa: E402
from engine.learner.batch import (  # noqa: E402
    pack,
    packed_layout,
    padded_layout,
    response_logprobs,
)
from engine.learner.learner import Learner  # noqa: E402
from engine.learner.ppo import PpoLearner  # noqa: E402
from engine.model import load_critic, load_policy, load_tokenizer  # noqa: E402
from engine.rollout.base import SamplingParams  # noqa: E402
from engine.rollout.torch_backend import TorchRollout  # noqa: E402
from engine.tasks import ArithmeticTask, ReverseTask  # noqa: E402
from engine.tasks.base import Problem  # noqa: E402
from engine.telemetry.devices import DeviceSampler  # noqa: E402
from engine.tinymodel import ensure_base_model  # noqa: E402
from engine.weightsync.fingerprint import fingerprint  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
ROWS: list[tuple[str, str, str]] = []


ONLY = [a for a in sys.argv[1:] if not a.startswith("-")]    # substrings of check names


def check(name: str, fn) -> object:
    """Run one check: fn() -> (result, value[, payload]); an exception is a FAIL."""
    if ONLY and not any(k in name for k in ONLY):
        return None
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:  # a check's failure is a row of the table, not the end of it
        traceback.print_exc()
        ROWS.append((name, "FAIL", f"{type(exc).__name__}: {exc}"[:160]))
        return None
    result, value, *payload = out
    ROWS.append((name, result, f"{value} [{time.perf_counter() - t0:.1f}s]"))
    return payload[0] if payload else None


def samples(model_dir: Path, prompts: int = 16, group: int = 8,
            top_p: float = 1.0) -> list[Sample]:
    """One demo-sized step: arithmetic prompts x group, sampled by the torch sampler."""
    tok = load_tokenizer(model_dir)
    problems = ArithmeticTask(ArithmeticTaskConfig()).train_problems(0, prompts)
    ids = [tok(p.prompt)["input_ids"] for p in problems for _ in range(group)]
    outs = TorchRollout.from_pretrained(model_dir).generate(
        ids, SamplingParams(temperature=1.0, top_p=top_p, max_new_tokens=8), seed=0)
    return [Sample(problems[i // group], p, o.token_ids, o.logprobs, o.finished, 0, i // group,
                   advantage=1.0 if i % 2 else -1.0)
            for i, (p, o) in enumerate(zip(ids, outs, strict=True))]


# --------------------------------------------------------------------------- checks

def learner_bf16(size: str):
    model_dir = ensure_base_model(size, 0)
    batch = pack(samples(model_dir), load_tokenizer(model_dir).pad_token_id)
    learner = Learner(load_policy(model_dir), GrpoConfig(lr=1e-4, minibatches=2), 1.0, seed=0,
                      setup=LearnerConfig(device=DEVICE, precision="bf16"))
    start = {n: t.clone() for n, t in learner.named_tensors()}
    t0, steps, losses = time.perf_counter(), 3, []
    for _ in range(steps):
        losses.append(learner.update(batch)["learner/loss"])
    if CUDA:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    moved = max(float((t - start[n]).abs().max()) for n, t in learner.named_tensors())
    where = {p.device.type for p in learner.policy.parameters()}
    dtypes = {p.dtype for p in learner.policy.parameters()}
    ok = (all(math.isfinite(x) for x in losses) and moved > 0 and where == {DEVICE}
          and dtypes == {torch.float32})
    tokens = sum(batch.row_tokens()) * steps
    return ("PASS" if ok else "FAIL",
            f"{steps} steps on {DEVICE}, loss {losses[-1]:+.4f}, max |dw| {moved:.1e}, "
            f"fp32 master weights, {tokens / seconds:,.0f} tok/s", learner)


def ppo_bf16():
    """PPO's critic (values, GAE, clipped value loss) and actor on the learner's device."""
    model_dir = ensure_base_model("tiny", 0)
    rows = samples(model_dir)
    for i, s in enumerate(rows):
        s.reward = float(i % 3 == 0)
    batch = pack(rows, load_tokenizer(model_dir).pad_token_id)
    learner = PpoLearner(load_policy(model_dir), load_critic(model_dir),
                         PpoConfig(minibatches=2, critic={"lr": 1e-3}), 1.0, seed=0,
                         setup=LearnerConfig(device=DEVICE, precision="bf16"))
    values, losses = [], []
    for _ in range(3):
        adv, m = learner.update_critic(batch)
        values.append(m["critic/value_loss"])
        losses.append(learner.update(batch, adv)["learner/loss"])
    where = {p.device.type for p in learner.critic.model.parameters()}
    dtypes = {p.dtype for p in learner.critic.model.parameters()}
    ok = (all(math.isfinite(x) for x in values + losses) and values[-1] < values[0]
          and where == {DEVICE} and dtypes == {torch.float32})
    return ("PASS" if ok else "FAIL",
            f"value loss {values[0]:.4f} -> {values[-1]:.4f}, actor loss {losses[-1]:+.4f}, "
            f"critic on {sorted(where)} in {sorted(map(str, dtypes))}")


def sampler_vs_learner(top_p: float = 1.0):
    """top_p < 1: the learner recomputes the nucleus the sampler drew from."""
    model_dir = ensure_base_model("tiny", 0)
    batch = pack(samples(model_dir, top_p=top_p), load_tokenizer(model_dir).pad_token_id)
    learner = Learner(load_policy(model_dir), GrpoConfig(), 1.0, seed=0,
                      setup=LearnerConfig(device=DEVICE, precision="fp32"), top_p=top_p)
    on_device = batch.to(learner.device)
    logp, _ = learner.recompute(on_device)      # (B, R), and no routing to agree on
    mask = on_device.response_mask.bool()
    gap = float((logp - on_device.behaviour_logp).abs()[mask].max())
    return ("PASS" if gap < 1e-3 else "FAIL",
            f"max |sampler(cpu) - learner({DEVICE})| = {gap:.2e} nats over {int(mask.sum())} "
            f"tokens (bound 1e-3)")


def packed_vs_padded():
    """On ragged rows: the long-tail reverse task's answers as responses."""
    model_dir = ensure_base_model("tiny", 0)
    tok = load_tokenizer(model_dir)
    problems = ReverseTask(LongTailTaskConfig()).train_problems(0, 64)
    rows = [Sample(p, tok(p.prompt)["input_ids"], r, [0.0] * len(r), True, 0, 0)
            for p in problems
            for r in [tok(p.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]]
    batch = pack(rows, tok.pad_token_id).to(DEVICE)
    model = load_policy(model_dir).to(DEVICE).eval()
    with torch.no_grad():
        padded, _ = response_logprobs(model, batch, 1.0)
        packed, _ = response_logprobs(model, batch, 1.0, packed=True)
    mask = batch.response_mask.bool()
    gap = float((padded - packed).abs()[mask].max())
    dense = packed_layout(batch)
    return ("PASS" if gap < 1e-4 and dense.input_ids.shape[0] < len(batch) else "FAIL",
            f"max |packed - padded| = {gap:.2e} (bound 1e-4); {len(batch)} sequences in "
            f"{dense.input_ids.shape[0]} packed rows, {dense.tokens} vs "
            f"{padded_layout(batch).tokens} padded slots")


def _ipc_receiver(inbox, outbox) -> None:
    """The rollout worker's process: map the learner's GPU buffer, load, fingerprint."""
    try:
        from engine.weightsync.cuda_ipc import CudaIpcReceiver

        ticket, model_dir = inbox.get(timeout=120)
        torch.cuda.set_device(0)
        engine = TorchRollout.from_pretrained(Path(model_dir))
        report = CudaIpcReceiver(None, None, 1).receive(ticket, engine)
        outbox.put(("ok", report.version, report.fingerprint, os.getpid()))
    except Exception as exc:
        outbox.put(("error", f"{type(exc).__name__}: {exc}", "", os.getpid()))


def cuda_ipc(learner: Learner | None):
    if not CUDA:
        return "SKIP", "no CUDA in this process"
    if learner is None:
        return "FAIL", "no trained learner to send (the tiny bf16 check failed)"
    from engine.weightsync.cuda_ipc import CudaIpcSender

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_ipc_receiver, args=(inbox, outbox))
    proc.start()
    sender = CudaIpcSender(None, 2)
    named = learner.named_tensors()
    ticket = sender.prepare(named, learner.version, initial=True)
    inbox.put((ticket, str(ensure_base_model("tiny", 0))))
    status, version, served, pid = outbox.get(timeout=240)
    proc.join(timeout=60)
    sender.close()
    if status != "ok":
        return "FAIL", version
    sent = fingerprint(named)
    ok = served == sent and version == learner.version and pid != os.getpid()
    return ("PASS" if ok else "FAIL",
            f"v{version} learner {sent} == receiver {served} (pid {pid})" if ok else
            f"v{version} learner {sent} != receiver {served}")


def nvml():
    if not CUDA:
        sampler = DeviceSampler(["gpu:0"])
        return "SKIP", f"{sampler.nvml_error}; no GPU to sample"
    sampler = DeviceSampler(["gpu:0"])
    if not sampler.on_gpu:
        return "FAIL", f"CUDA works but NVML does not: {sampler.nvml_error}"
    stop = threading.Event()

    def load() -> None:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        while not stop.is_set():
            a @ a
            torch.cuda.synchronize()

    worker = threading.Thread(target=load)
    worker.start()
    time.sleep(1.5)
    m = sampler.sample()
    stop.set()
    worker.join()
    util, used = m["device/gpu_util/gpu:0"], m["device/memory_gb/gpu:0"]
    total = m["device/memory_total_gb/gpu:0"]
    return ("PASS" if util > 0 and used > 0 else "FAIL",
            f"under matmul load: gpu_util {util:.0f} %, memory {used:.1f}/{total:.1f} GB")


def cpu_sampling():
    sampler = DeviceSampler(["cpu:0"])
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    m = sampler.sample()
    util = m["device/cpu_util/cpu:0"]
    return ("PASS" if util > 0 else "FAIL",
            f"after 0.3 s busy: cpu_util {util:.0f} %, rss {m['device/memory_gb/cpu:0']:.2f} GB")


def _sharded_rank(rank: int, world: int, backend: str, port: int, model_dir: str,
                  outbox) -> None:
    """One rank of the engine's ShardedLearner (engine/learner/sharded.py): one GRPO
    update on the shared batch, then the gathered full weights."""
    import torch.distributed as dist

    from engine.learner.sharded import ShardedLearner

    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world,
                                init_method=f"tcp://127.0.0.1:{port}")
        learner = ShardedLearner(load_policy(Path(model_dir)), GrpoConfig(minibatches=2),
                                 1.0, seed=0, setup=_sharded_setup(backend))
        metrics = learner.update(_sharded_batch(Path(model_dir)))
        full = learner.named_tensors()                       # a gather every rank joins
        if rank == 0:
            # numpy, pickled by value: torch tensors would travel as shared-memory handles
            # that die with this process, which may exit before the parent reads them
            outbox.put(("ok", metrics["learner/loss"], fingerprint(full),
                        {n: t.cpu().numpy() for n, t in full}))
        dist.destroy_process_group()
    except Exception as exc:
        outbox.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}", "", {}))


def _sharded_setup(backend: str) -> LearnerConfig:
    return LearnerConfig(device="cuda" if backend == "nccl" else "cpu")


def _sharded_batch(model_dir: Path):
    return pack(samples(model_dir, prompts=4, group=4), load_tokenizer(model_dir).pad_token_id)


def fsdp2():
    gpus = torch.cuda.device_count() if CUDA else 0
    backend = "nccl" if gpus > 1 else "gloo"
    model_dir = ensure_base_model("tiny", 0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    procs = [ctx.Process(target=_sharded_rank,
                         args=(r, 2, backend, port, str(model_dir), outbox)) for r in range(2)]
    for p in procs:
        p.start()
    status, loss, fp, sharded = outbox.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    if status != "ok":
        return "FAIL", loss
    single = Learner(load_policy(model_dir), GrpoConfig(minibatches=2), 1.0, seed=0,
                     setup=_sharded_setup(backend))
    ref_loss = single.update(_sharded_batch(model_dir))["learner/loss"]
    dw = max(float((torch.from_numpy(sharded[n]) - t.cpu()).abs().max())
             for n, t in single.named_tensors())
    ok = abs(loss - ref_loss) < 1e-5 and dw < 1e-5
    where = "NCCL, 2 GPUs" if backend == "nccl" else (
        f"gloo on CPU ({gpus} GPU: NCCL needs 2, skipped)" if CUDA else "gloo on CPU")
    return ("PASS" if ok else "FAIL",
            f"ShardedLearner, {where}: loss {loss:.6f} vs 1 process {ref_loss:.6f}, "
            f"max |dw| {dw:.1e} (bound 1e-5)")


def moe_replay():
    """MoE routing replay: the torch sampler (CPU) records each token's experts, the
    learner on the device replays them; its logprobs equal the sampler's to the dense
    bound and its own routing agrees on every token (tiny random qwen2_moe and mixtral,
    built here as the tests build them)."""
    import tempfile

    from tests.engine.hf_models import MOE_ARCHITECTURES, build_hf_model

    out = []
    for arch in MOE_ARCHITECTURES:
        path = build_hf_model(Path(tempfile.mkdtemp()) / arch, arch)
        tok = load_tokenizer(path)
        prompts = [tok(t)["input_ids"] for t in ("12+34=", "rev:abcdef=", "7*8=")] * 4
        outs = TorchRollout.from_pretrained(path, record_routing=True).generate(
            prompts, SamplingParams(temperature=1.0, max_new_tokens=12), seed=3)
        rows = [Sample(Problem("", ""), p, o.token_ids, o.logprobs, o.finished, o.version, 0,
                       routing=o.routing) for p, o in zip(prompts, outs, strict=True)]
        learner = Learner(load_policy(path), GrpoConfig(), 1.0, seed=0,
                          setup=LearnerConfig(device=DEVICE, precision="fp32",
                                              routing_replay=True))
        m = learner.update(pack(rows, tok.pad_token_id))
        out.append((arch, m["logprob_gap/max"], m["moe/routing_agreement"]))
    ok = all(gap < 1e-3 and agree == 1.0 for _, gap, agree in out)
    return ("PASS" if ok else "FAIL",
            "; ".join(f"{a}: max gap {g:.1e}, routing agreement {r:.3f}" for a, g, r in out)
            + f" (learner on {DEVICE}, bound 1e-3)")


def main() -> int:
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name(0) if CUDA else "none"
    print(f"torch {torch.__version__}, GPU {gpu}"
          f", {torch.cuda.device_count() if CUDA else 0} GPU(s), python {sys.version.split()[0]}")
    tiny = check("learner bf16 update, tiny", lambda: learner_bf16("tiny"))
    if CUDA:
        check("learner bf16 update, small", lambda: learner_bf16("small"))
    else:
        check("learner bf16 update, small", lambda: ("SKIP", "CPU machine: tiny only"))
    check("PPO critic + actor bf16 update, tiny", ppo_bf16)
    check("sampler vs learner logprobs (fp32)", sampler_vs_learner)
    check("sampler vs learner logprobs at top_p 0.9 (fp32)", lambda: sampler_vs_learner(0.9))
    check("packed vs padded logprobs (fp32)", packed_vs_padded)
    check("MoE routing replay (fp32)", moe_replay)
    check("cuda_ipc transport, 2 processes", lambda: cuda_ipc(tiny))
    check("NVML sampling", nvml)
    check("CPU process sampling", cpu_sampling)
    check("FSDP2 sharded step, 2 processes", fsdp2)

    width = max(len(r[0]) for r in ROWS)
    print(f"\n{'check':{width}s}  result  value")
    for name, result, value in ROWS:
        print(f"{name:{width}s}  {result:6s}  {value}")
    failed = [r for r in ROWS if r[1] == "FAIL"]
    skipped = [r[0] for r in ROWS if r[1] == "SKIP"]
    if skipped:
        print(f"skipped: {', '.join(skipped)}")
    print("FAILED" if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
