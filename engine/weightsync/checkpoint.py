"""Checkpoint-file transport: the slow fallback that needs only a shared directory.

    learner                                       rollout worker
    prepare: save_file(tensors, v000000042.safetensors)  (written to a temp name, renamed)
    ticket = (version, layout, path)  ---------->  load_file(path) -> engine.load_weights

The learner keeps the newest ``keep_last`` files. A worker never sees a half-written file:
the rename is atomic.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.weightsync.base import ReceiverDefaults, SenderDefaults, Ticket, load_checked
from engine.weightsync.layout import FlatLayout


class CheckpointFileSender(SenderDefaults):
    name = "checkpoint"

    def __init__(self, cfg, world_size: int):
        self.directory = Path(cfg.directory or tempfile.mkdtemp(prefix="rlplane-weightsync-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep_last = cfg.keep_last

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False) -> Ticket:
        path = self.directory / f"v{version:09d}.safetensors"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        save_file({n: t.detach().contiguous().cpu() for n, t in named_tensors}, tmp)
        os.replace(tmp, path)
        for old in sorted(self.directory.glob("v*.safetensors"))[:-self.keep_last]:
            old.unlink()
        return Ticket(self.name, version, initial, FlatLayout.of(named_tensors), str(path))


class CheckpointFileReceiver(ReceiverDefaults):
    def receive(self, ticket: Ticket, engine):
        tensors = load_file(ticket.payload)
        return load_checked(engine, ticket, [(s.name, tensors[s.name])
                                             for s in ticket.layout.specs])
