"""FSDP2 over 2 gloo processes: the sharded learner's step is the single process's.

Both sides start from the same weights and take one GRPO update on the same ragged batch
(2 minibatches, micro-batched so the ranks' micro-batch counts differ and padding runs);
the loss, the grad norm and every updated full weight must agree. Tolerance: 1e-5 on the
loss and grad norm (fp32, a different summation order across ranks); weights within 1e-6
absolute where AdamW's steps are well conditioned (|grad| > 1e-6, as
test_learner_devices explains) for all but 1e-4 of them, and within 1e-5 (a tenth of one
lr = 1e-4 step) for every one: the second minibatch's step starts from weights that
already differ by rounding, which AdamW's normalization amplifies for small gradients.
"""

import contextlib
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.config import GrpoConfig, LearnerConfig
from engine.learner.learner import Learner
from engine.model import load_policy
from engine.weightsync.fingerprint import fingerprint

from .test_learner_devices import ragged_batch  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow

GRPO = {"minibatches": 2, "kl_coef": 0.05}
SETUP = {"micro_batch_tokens": 40}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int):
    """A spawned rank's gloo process group. Teardown starts with a barrier: gloo's barrier
    waits for every earlier collective of this rank, and no rank destroys its group while a
    peer is still inside one (a rank that tore down first aborted its peer at exit with
    "terminate called without an active exception", once in a CI run)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


def rank_main(rank: int, world: int, port: int, tiny_dir, batch, out_path) -> None:
    with gloo_group(rank, world, port):
        from engine.learner.sharded import ShardedLearner

        torch.manual_seed(0)
        learner = ShardedLearner(load_policy(tiny_dir), GrpoConfig(**GRPO), 0.7, seed=0,
                                 reference=load_policy(tiny_dir),
                                 setup=LearnerConfig(**SETUP))
        metrics = learner.update(batch)
        named = learner.named_tensors()                 # collective: every rank gathers
        fp = learner.fingerprint()
        if rank == 0:
            torch.save((metrics, dict(named), fp), out_path)


def run_ranks(target, world: int, *args):
    """Run ``target(rank, world, port, *args)`` in ``world`` spawned processes; a rank that
    dies fails the test at once instead of leaving the others waiting in a collective."""
    ctx, port = mp.get_context("spawn"), free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        while any(p.is_alive() for p in procs):
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a rank died (exit codes {dead}); its traceback is above"
            time.sleep(0.5)
        assert [p.exitcode for p in procs] == [0] * world
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def test_two_gloo_ranks_take_the_single_process_step(tiny_dir, ragged_batch,  # noqa: F811
                                                     tmp_path):
    torch.manual_seed(0)
    single = Learner(load_policy(tiny_dir), GrpoConfig(**GRPO), 0.7, seed=0,
                     reference=load_policy(tiny_dir), setup=LearnerConfig(**SETUP))
    grads = {}
    step = single.optimizer.step
    single.optimizer.step = lambda: (grads.update(
        {n: p.grad.clone() for n, p in single.policy.named_parameters()}), step())
    expected = single.update(ragged_batch)

    run_ranks(rank_main, 2, tiny_dir, ragged_batch, tmp_path / "rank0.pt")
    metrics, weights, fp = torch.load(tmp_path / "rank0.pt")

    for key in ("learner/loss", "learner/grad_norm", "learner/entropy", "learner/kl_ref",
                "logprob_gap/max"):
        assert metrics[key] == pytest.approx(expected[key], abs=1e-5), key
    diffs = torch.cat([(weights[n] - p.detach())[grads[n].abs() > 1e-6].abs()
                       for n, p in single.policy.named_parameters()])
    print(f"\nweights: max |diff| {float(diffs.max()):.2e}, share over 1e-6 "
          f"{float((diffs > 1e-6).float().mean()):.2e} of {diffs.numel()}")
    assert float(diffs.max()) < 1e-5                       # a tenth of one lr-sized step
    assert float((diffs > 1e-6).float().mean()) < 1e-4
    assert fp == fingerprint(weights.items())
