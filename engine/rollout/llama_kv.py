"""A Llama forward pass over a preallocated KV cache, for batched sampling.

It reads the same HF-named tensors as ``LlamaForCausalLM`` (so weight sync speaks one
naming) and reproduces its math in fp32: RMSNorm, rotary embedding (rotate_half
convention, default rope), SDPA attention, SwiGLU MLP, lm_head (the input embedding
when tied). ``supports(config)`` says which Llama configs that is; the torch sampler
takes this path for them (it is faster than the model's own forward over transformers'
growing cache) and engine.rollout.hf_kv for every other causal LM.

Cache layout, one slot per position of the padded batch:

    slot:      0    1    2    3  | 4    5    6 ...        S-1
    row 0:   pad  pad   b    7   | x    y   <eos> ...            prompt left-padded
    row 1:    b    1    2    +   | z   ...                       to P, then P+t per step

A query at slot i attends to the valid slots j <= i of its row (pad slots are never keys).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import LlamaConfig


class LlamaKV:
    @staticmethod
    def supports(config) -> bool:
        """Whether this forward reproduces ``config``'s model exactly: a Llama without
        biases, with SiLU and plain rotary embeddings (no Llama-3 style rope scaling)."""
        rope = getattr(config, "rope_parameters", None) or {}
        return (config.model_type == "llama" and not config.attention_bias
                and not config.mlp_bias and config.hidden_act == "silu"
                and rope.get("rope_type", "default") == "default"
                and getattr(config, "pretraining_tp", 1) in (None, 1))

    def __init__(self, config: LlamaConfig, tensors: dict[str, torch.Tensor]):
        self.cfg = config
        self.w = tensors
        self.n_layers = config.num_hidden_layers
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads)
        self.eps = config.rms_norm_eps
        theta = config.rope_parameters["rope_theta"] if getattr(
            config, "rope_parameters", None) else config.rope_theta
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2,
                                                       dtype=torch.float32) / self.head_dim))

    def new_cache(self, batch: int, slots: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        shape = (self.n_layers, batch, self.n_kv, slots, self.head_dim)
        return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(x.dtype)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        freqs = positions[..., None].float() * self.inv_freq          # (B, T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)                       # (B, T, D)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]   # (B, 1, T, D)

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    @staticmethod
    def select(cache: tuple[torch.Tensor, ...], rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The cache of the batch rows ``rows`` (finished rows stop costing compute)."""
        return cache[0][:, rows], cache[1][:, rows]

    @staticmethod
    def rows(cache: tuple[torch.Tensor, ...], a: int, b: int) -> tuple[torch.Tensor, ...]:
        """A view of batch rows [a, b) of the cache: a forward on it writes in place."""
        return cache[0][:, a:b], cache[1][:, a:b]

    reuses_prefixes = True       # a stored prefix can be put into its cache (put)

    @staticmethod
    def slot_bytes(cache: tuple[torch.Tensor, ...]) -> int:
        """The bytes of one row's keys and values at one slot, every layer."""
        return sum(x[:, 0, :, 0].nbytes for x in cache)

    @staticmethod
    def take(cache: tuple[torch.Tensor, ...], rows: torch.Tensor,
             end: int) -> tuple[torch.Tensor, ...]:
        """A copy of the keys and values of batch rows ``rows`` at slots [0, end):
        (L, len(rows), kv, end, D) each."""
        return cache[0][:, rows, :, :end], cache[1][:, rows, :, :end]

    @staticmethod
    def put(cache: tuple[torch.Tensor, ...], row: int, a: int,
            kv: tuple[torch.Tensor, ...]) -> None:
        """One row of a ``take`` (L, kv, n, D) each, into batch row ``row`` at slots
        [a, a + n)."""
        n = kv[0].shape[2]
        cache[0][:, row, :, a:a + n] = kv[0]
        cache[1][:, row, :, a:a + n] = kv[1]

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: tuple[torch.Tensor, ...],
                start: int, valid: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """Logits for ``ids`` (B, T) written at slots [start, start+T).

        ``valid`` (B, S) marks the non-pad slots up to start+T. Returns (B, T, V), or
        (B, 1, V) for the last position only with ``last_only`` (a prefill that samples).
        """
        w, (k_cache, v_cache) = self.w, cache
        B, T = ids.shape
        end = start + T
        x = F.embedding(ids, w["model.embed_tokens.weight"])          # (B, T, H)
        cos, sin = self._rope(positions, x.dtype)
        q_slots = torch.arange(start, end)[:, None]
        k_slots = torch.arange(end)[None, :]
        causal = k_slots <= q_slots                                   # (T, end)
        mask = causal[None] & valid[:, None, :end]                    # (B, T, end)
        mask |= (k_slots == q_slots)[None]                            # pad queries see self
        mask = mask[:, None]                                          # (B, 1, T, end)
        rep = self.n_heads // self.n_kv
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            h = self._rms(x, w[p + "input_layernorm.weight"])
            q = F.linear(h, w[p + "self_attn.q_proj.weight"]).view(B, T, self.n_heads, -1)
            k = F.linear(h, w[p + "self_attn.k_proj.weight"]).view(B, T, self.n_kv, -1)
            v = F.linear(h, w[p + "self_attn.v_proj.weight"]).view(B, T, self.n_kv, -1)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)   # (B, h, T, D)
            q = q * cos + self._rotate_half(q) * sin
            k = k * cos + self._rotate_half(k) * sin
            k_cache[i, :, :, start:end] = k
            v_cache[i, :, :, start:end] = v
            keys, vals = k_cache[i, :, :, :end], v_cache[i, :, :, :end]
            if rep > 1:
                keys = keys.repeat_interleave(rep, dim=1)
                vals = vals.repeat_interleave(rep, dim=1)
            a = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)
            a = a.transpose(1, 2).reshape(B, T, -1)
            x = x + F.linear(a, w[p + "self_attn.o_proj.weight"])
            h = self._rms(x, w[p + "post_attention_layernorm.weight"])
            gate = F.linear(h, w[p + "mlp.gate_proj.weight"])
            up = F.linear(h, w[p + "mlp.up_proj.weight"])
            x = x + F.linear(F.silu(gate) * up, w[p + "mlp.down_proj.weight"])
        if last_only:
            x = x[:, -1:]
        x = self._rms(x, w["model.norm.weight"])
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])   # tied: one tensor
        return F.linear(x, head)                                      # (B, T, V)
