"""Any causal LM's own forward over transformers' KV cache, for batched sampling.

The torch sampler's path for every architecture the hand-written Llama forward does not
cover (Qwen2 with its q/k/v biases, Qwen3 with q/k norms, Mistral, Llama-3 rope
scaling, ...). Same interface and cache layout as engine.rollout.llama_kv.LlamaKV:

    slot:      0    1    2    3  | 4    5  ...
    row 0:   pad  pad   b    7   | x    y        prompt left-padded to P, then one slot
    row 1:    b    1    2    +   | z   ...       per decode step; ``valid`` (B, S) marks
                                                 the non-pad slots

The cache is a ``DynamicCache`` built from the model's config (sliding-window layers
where the config has them); each forward appends T slots, so ``start`` is always the
cache's length. The attention mask handed to the model is ``valid[:, :start+T]``, and
positions count valid slots, exactly as the learner's packed batch does: the logits
equal the learner's teacher-forced recompute token for token.

The parameters are the model's own (``named_parameters()``: a tied output embedding is
listed once, as the input embedding), so a weight sync copies into what this forward
reads and the fingerprint covers what it serves.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class HFKV:
    def __init__(self, model: torch.nn.Module):
        self.model = model.eval().requires_grad_(False)
        self.config = model.config

    def tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters())

    def new_cache(self, batch: int, slots: int, dtype: torch.dtype) -> DynamicCache:
        return DynamicCache(config=self.config)

    @staticmethod
    def select(cache: DynamicCache, rows: torch.Tensor) -> DynamicCache:
        cache.batch_select_indices(rows)
        return cache

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: DynamicCache,
                start: int, valid: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Logits (B, T, V) for ``ids`` (B, T) at slots [start, start+T), or (B, 1, V) for
        the last position only with ``last_only``."""
        T = ids.shape[1]
        if cache.get_seq_length() != start:
            raise ValueError(f"the cache holds {cache.get_seq_length()} slots; a forward "
                             f"at slot {start} would misplace keys")
        return self.model(input_ids=ids, attention_mask=valid[:, :start + T].long(),
                          position_ids=positions, past_key_values=cache, use_cache=True,
                          logits_to_keep=1 if last_only else 0).logits
