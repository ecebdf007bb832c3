"""The learner sharded over N processes with FSDP2 (``placement.learner_devices = N``).

    rank r of N (one process per device; gloo on CPU, NCCL on CUDA)
      fully_shard(each decoder layer), fully_shard(model)   parameters, grads, AdamW state
                                                            live as 1/N shards (DTensor)
      recompute: every rank runs the forward over the whole batch (no grad), so each holds
                 the old logprobs, TIS weights and gap metrics of every row
      minibatch: rank r trains rows r, r+N, ... of it; its loss is its rows' share of the
                 WHOLE minibatch's aggregated loss, gradients are reduce-scattered as a
                 sum (divide factor 1), so the step is one process's on the whole minibatch
      a rank with fewer micro-batches than another pads with zero-weight ones: FSDP's
      collectives need the same number of forwards and backwards on every rank

    ranks   0        1        ...  N-1         weight sync / checkpoint
    shards  [0:k)    [k:2k)        ...         full_tensor() gathers every parameter on
                                               every rank (a collective: all ranks call
                                               named_tensors); rank 0 sends and writes

Recomputing on every rank costs N x the forward-only work of one; training, the memory of
parameters, gradients and optimizer state are split N ways.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from engine.config import AlgorithmConfig, LearnerConfig
from engine.learner.batch import PackedBatch
from engine.learner.checkpoint import (
    prune_checkpoints,
    publish,
    read_run_state,
    write_run_state,
)
from engine.learner.learner import Learner
from engine.weightsync.fingerprint import fingerprint


def shard_policy(policy: torch.nn.Module, setup: LearnerConfig,
                 device: torch.device) -> torch.nn.Module:
    """FSDP2 over the default process group: one unit per decoder layer, one for the base
    model (embeddings, final norm), one for the output head, then the root. The loss calls
    the base model and the head separately (engine.learner.batch.response_logprobs), so
    each must gather its own parameters. bf16 precision computes in bfloat16 with float32
    master shards and reductions. The mesh is named for ``device``: fully_shard's default
    mesh is CUDA wherever CUDA exists, which put a gloo (CPU) learner's shards on cuda:0 on
    a GPU machine (found by scripts/gpu-check on an H200)."""
    if policy.config.tie_word_embeddings:
        raise ValueError("placement.learner_devices > 1 shards the output head apart from "
                         "the embeddings, and this model ties them (tie_word_embeddings); "
                         "train it with learner_devices = 1")
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if setup.precision == "bf16" else MixedPrecisionPolicy())
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    base = policy.base_model
    for layer in base.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(base, mesh=mesh, mp_policy=mp)
    fully_shard(policy.get_output_embeddings(), mesh=mesh, mp_policy=mp)
    fully_shard(policy, mesh=mesh, mp_policy=mp)
    for unit in (policy, base, policy.get_output_embeddings(), *base.layers):
        unit.set_gradient_divide_factor(1.0)     # a sum: each rank's loss is its share
        unit.set_force_sum_reduction_for_comms(True)   # gloo has neither AVG nor PREMUL_SUM
    return policy


class ShardedLearner(Learner):
    """A Learner whose policy is FSDP2-sharded across the default process group."""

    def __init__(self, policy: torch.nn.Module, cfg: AlgorithmConfig, temperature: float,
                 seed: int, reference: torch.nn.Module | None = None,
                 setup: LearnerConfig | None = None, norm_tokens: int | None = None,
                 top_p: float = 1.0):
        setup = setup or LearnerConfig()
        if not dist.is_initialized():
            raise RuntimeError("ShardedLearner needs torch.distributed initialized "
                               "(one process per placement.learner_devices)")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        device = torch.device("cuda", torch.cuda.current_device()) if (
            dist.get_backend() == "nccl") else torch.device("cpu")
        policy = shard_policy(policy.to(device), setup, device)
        if reference is not None and setup.reference == "device":
            reference = shard_policy(reference.to(device), setup, device)   # never trained
        super().__init__(policy, cfg, temperature, seed, reference, setup, norm_tokens,
                         top_p=top_p)

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Full tensors, gathered from every rank's shard: every rank must call this."""
        return [(n, p.detach().full_tensor() if isinstance(p, DTensor) else p.detach())
                for n, p in self.policy.named_parameters()]

    def _train_runs(self, batch: PackedBatch,
                    idx: torch.Tensor) -> list[tuple[torch.Tensor, float]]:
        mine = idx[self.rank::self.world]
        runs = [(m, 1.0) for m in self._micro_batches(batch, mine)] if len(mine) else []
        count = torch.tensor([len(runs)], device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        filler = mine[:1] if len(mine) else idx[:1]
        return runs + [(filler, 0.0)] * (int(count) - len(runs))

    def _clip_grads(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(),
                                              self.cfg.max_grad_norm)
        return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)

    def _sum_over_ranks(self, totals: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(totals)
        return totals


# --------------------------------------------------------------------------- checkpoints
#
#   <run>/checkpoints/step_000012/   as a single-process checkpoint (HF dir of the full
#       ...                          weights, rng.pt, state.json), written by rank 0, plus
#       optim/                       AdamW state in torch.distributed.checkpoint's sharded
#                                    format: each rank writes and reads its own shards
#
# The ranks of one learner sit in one placement bundle, so on one node: they share the
# run directory's filesystem, which the staging directory and the rename rely on.

def save_sharded_checkpoint(root: Path, learner: ShardedLearner, model_dir: Path,
                            keep_last: int,
                            files: dict[str, str] | None = None) -> tuple[Path, str]:
    """Every rank calls this (it gathers weights and writes optimizer shards); returns the
    checkpoint and the fingerprint of its weights. ``files``: the driver's (rank 0's)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    final = root / f"step_{learner.step:06d}"
    staging = root / f".{final.name}.staging"
    if learner.rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    dist.barrier()
    named = learner.named_tensors()                               # collective
    fp = fingerprint(named)
    dcp.save({"optim": get_optimizer_state_dict(learner.policy, learner.optimizer)},
             checkpoint_id=staging / "optim")                     # collective
    if learner.rank == 0:
        full = {n: t.cpu() for n, t in named}
        learner.policy.save_pretrained(staging, state_dict=full, safe_serialization=True)
        write_run_state(staging, learner, model_dir, fp, files)
        publish(staging, final)
        prune_checkpoints(root, keep_last)
    dist.barrier()
    return final, fp


def restore_sharded_checkpoint(path: Path, learner: ShardedLearner) -> dict:
    """Every rank calls this, with a learner whose policy was loaded from ``path``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    if not (path / "optim").is_dir():
        raise RuntimeError(f"{path} was not written by a sharded learner (no optim/): resume "
                           f"it with the placement.learner_devices it was written with")
    state = {"optim": get_optimizer_state_dict(learner.policy, learner.optimizer)}
    dcp.load(state, checkpoint_id=path / "optim")
    set_optimizer_state_dict(learner.policy, learner.optimizer, state["optim"])
    return read_run_state(path, learner)
