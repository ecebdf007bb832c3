"""In-place transport: the rollout engine lives in the learner's process.

    learner                                  rollout engine (same process)
    prepare: ticket = (version, layout,      engine.load_weights(tensors): copy_ into its
             the learner's own tensors)      own tensors (no reallocation), fingerprint

Nothing is copied on the way: the ticket carries the learner's live tensors, which is safe
because the learner does not step while the engine copies: in the driver's thread it
cannot, and with the worker on a thread of its own (placement.overlap_threads) the
deployment waits for the copy before each update (Deployment.update). Unlike the
two-sided transports the receiver takes whatever version the learner says, so a learner
whose counter went backwards (faults.version_reset) reaches the alerts, not an exception.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.weightsync.base import ReceiverDefaults, SenderDefaults, Ticket
from engine.weightsync.layout import FlatLayout


class InPlaceSender(SenderDefaults):
    name = "in_place"

    def __init__(self, cfg, world_size: int):
        pass

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False) -> Ticket:
        named = list(named_tensors)
        return Ticket(self.name, version, initial, FlatLayout.of(named), named)


class InPlaceReceiver(ReceiverDefaults):
    def receive(self, ticket: Ticket, engine):
        return engine.load_weights(ticket.payload, ticket.version, verify=ticket.verify)
