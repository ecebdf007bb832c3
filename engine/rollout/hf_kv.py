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

A prefix the torch sampler's prefix cache stored (engine.rollout.prefix_cache) is put
into a new cache by ``preload``: the slots left of the prefill's window, each row's stored
keys and values there; the window is then fed as usual. Only where every layer of the
model's cache is a plain growing one (``reuses_prefixes``): a sliding window's layer
drops old slots.

The parameters are the model's own (``named_parameters()``: a tied output embedding is
listed once, as the input embedding), so a weight sync copies into what this forward
reads and the fingerprint covers what it serves.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class HFKV:
    def __init__(self, model: torch.nn.Module):
        self.model = model.eval().requires_grad_(False)
        self.config = model.config

    @property
    def reuses_prefixes(self) -> bool:
        """Whether a prefix can be put into this model's cache (``preload``): every layer
        a plain growing one (not a sliding window's, nor a recurrent state)."""
        return all(type(layer) is DynamicLayer
                   for layer in DynamicCache(config=self.config).layers)

    def tensors(self) -> dict[str, torch.Tensor]:
        return dict(self.model.named_parameters())

    def new_cache(self, batch: int, slots: int, dtype: torch.dtype) -> DynamicCache:
        return DynamicCache(config=self.config)

    @staticmethod
    def slot_bytes(cache: DynamicCache) -> int:
        """The bytes of one row's keys and values at one slot, every layer."""
        return sum(layer.keys[0, :, 0].nbytes + layer.values[0, :, 0].nbytes
                   for layer in cache.layers)

    @staticmethod
    def take(cache: DynamicCache, rows: torch.Tensor, end: int) -> tuple[torch.Tensor, ...]:
        """A copy of the keys and values of batch rows ``rows`` at slots [0, end):
        (L, len(rows), kv, end, D) each, engine.rollout.llama_kv's layout."""
        return (torch.stack([layer.keys[rows, :, :end] for layer in cache.layers]),
                torch.stack([layer.values[rows, :, :end] for layer in cache.layers]))

    @staticmethod
    def preload(cache: DynamicCache, batch: int, slots: int,
                rows: list[tuple[int, int, tuple[torch.Tensor, ...]]]) -> None:
        """An empty ``cache`` filled to ``slots`` slots: row j's stored keys and values
        (one row of a ``take``: (L, kv, n, D) each; a < slots) from slot a on, for each
        (j, a, kv) of ``rows``, cut at ``slots``; zeros elsewhere (pad slots, never
        attended). Keys and values may differ in shape (MLA's do)."""
        keys, values = (torch.zeros((x.shape[0], batch, x.shape[1], slots, *x.shape[3:]),
                                    dtype=x.dtype) for x in rows[0][2])
        for j, a, (k, v) in rows:
            keys[:, j, :, a:slots] = k[:, :, :slots - a]
            values[:, j, :, a:slots] = v[:, :, :slots - a]
        for i in range(len(keys)):
            cache.update(keys[i], values[i], i)

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
