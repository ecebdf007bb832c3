"""Pack samples into the learner's padded tensors.

    columns:  [ pad .. pad  prompt | response  pad .. pad ]
               <------ P ------->  <------- R ------->

Prompts are left-padded to P and responses right-padded to R, the layout the torch sampler
uses, so positions (cumsum of the attention mask - 1) agree token for token. The logits
at column P+t-1 predict response token t.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.experience import Sample


@dataclass
class PackedBatch:
    input_ids: torch.Tensor        # (B, P+R)
    attention_mask: torch.Tensor   # (B, P+R)
    position_ids: torch.Tensor     # (B, P+R)
    response_mask: torch.Tensor    # (B, R) float, 1 on real response tokens
    behaviour_logp: torch.Tensor   # (B, R)
    advantages: torch.Tensor       # (B,)
    prompt_len: int                # P

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor) -> PackedBatch:
        return PackedBatch(self.input_ids[idx], self.attention_mask[idx], self.position_ids[idx],
                           self.response_mask[idx], self.behaviour_logp[idx],
                           self.advantages[idx], self.prompt_len)


def pack(samples: list[Sample], pad_id: int) -> PackedBatch:
    B = len(samples)
    P = max(len(s.prompt_ids) for s in samples)
    R = max(max(len(s.response_ids) for s in samples), 1)
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    rmask = torch.zeros((B, R))
    beh = torch.zeros((B, R))
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids[i, P - p:P] = torch.tensor(s.prompt_ids)
        ids[i, P:P + r] = torch.tensor(s.response_ids, dtype=torch.long)
        attn[i, P - p:P + r] = 1
        rmask[i, :r] = 1.0
        beh[i, :r] = torch.tensor(s.behaviour_logprobs)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return PackedBatch(ids, attn, pos, rmask, beh, adv, P)


def response_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced logprobs (B, R) of the response tokens under logits / temperature,
    and optionally the per-token entropy (B, R) of that distribution."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=batch.position_ids).logits          # (B, P+R, V)
    P = batch.prompt_len
    logits = logits[:, P - 1:-1].float() / temperature              # (B, R, V)
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = batch.input_ids[:, P:]                                # (B, R)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
