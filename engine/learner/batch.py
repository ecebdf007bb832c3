"""The learner's batch, and the two layouts a forward pass can see it in.

The batch keeps one row per sample, in the loss layout every per-token quantity shares:

    columns:  [ pad .. pad  prompt | response  pad .. pad ]
               <------ P ------->  <------- R ------->

Prompts are left-padded to P and responses right-padded to R, the layout the torch sampler
uses, so positions (cumsum of the attention mask - 1) agree token for token. The output
at column P+t-1 predicts response token t. Behaviour logprobs, advantages, masks and the
logprobs a forward returns are all (B, R) in this layout. A multi-turn trajectory's
observation tokens are response columns with mask 0 (Sample.loss_mask): attended to like
any context, but no output that predicts them goes through the LM head, so they carry no
logprob, loss, KL, entropy or gradient.

A forward pass sees the rows either as they are ("padded": B rows of P+R columns, most of
them pad when lengths are ragged) or packed end to end into a few dense rows:

    packed row 0:  [ a a a a a A A | b b b B B B B B | c c C ]     position ids restart at
    packed row 1:  [ d d d d D D D D D D D | e e e E | pad pad ]    each sequence's start

Where rows share their prompt (a GRPO group's completions), the packed layout holds the
prompt once and the group's responses after it, each attending to the prompt and to
itself by a 4-D mask (shared_layout): the demo's 16 prompts x 8 completions compute 624
token slots instead of 1,408, with the same logprobs and gradients.

HF transformers (5.x, masking_utils.find_packed_sequence_indices) reads a packed row from
position ids that restart, when no 2-D attention mask is given and no KV cache is in use:
attention is then causal within each sequence and never crosses sequences, for sdpa and
eager attention alike (and flash attention's varlen path). Pad only fills the tail of a
packed row, after every real token, so no real token attends to it.

Only the outputs that predict response tokens go through the LM head, in float32: the
logits are the one place where a bf16 rounding would show up directly in the logprobs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.experience import Sample
from engine.learner.losses import terminal_rewards
from engine.moe import RouterHooks, same_experts
from engine.sampling import entropy as token_entropy
from engine.sampling import processed_logprobs

PACKED_ROW_TOKENS = 64
"""Packed rows hold at least this many tokens (more when one sequence is longer). A row
of several sequences needs a materialized block-diagonal mask, and sdpa then computes all
T x T scores of the row, so attention costs each token its row's length T while a longer
row saves little more pad once it holds a few sequences. 64 was fastest or near it for
the demo and long-tail recipes on CPU (bench/learner_throughput.py --row-tokens)."""


@dataclass
class PackedBatch:
    """The samples of one update in the loss layout (module docstring)."""

    input_ids: torch.Tensor        # (B, P+R)
    attention_mask: torch.Tensor   # (B, P+R)
    position_ids: torch.Tensor     # (B, P+R)
    response_mask: torch.Tensor    # (B, R) float, 1 on response tokens the policy sampled
                                   # (0 on pad and on a trajectory's observations)
    behaviour_logp: torch.Tensor   # (B, R)
    advantages: torch.Tensor       # (B,)
    prompt_len: int                # P
    in_loss: torch.Tensor          # (B,) float, 0 for a sequence masked out of the loss
    rewards: torch.Tensor          # (B,) learning rewards
    token_rewards: torch.Tensor    # (B, R) where PPO's GAE finds them: each row's credit
                                   # (Sample.credit), the rest on its last sampled token
    routing: torch.Tensor | None = None  # (B, P+R, L, k) recorded experts, -1: none (engine.moe)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: torch.Tensor) -> PackedBatch:
        return PackedBatch(self.input_ids[idx], self.attention_mask[idx], self.position_ids[idx],
                           self.response_mask[idx], self.behaviour_logp[idx],
                           self.advantages[idx], self.prompt_len, self.in_loss[idx],
                           self.rewards[idx], self.token_rewards[idx],
                           self.routing[idx] if self.routing is not None else None)

    def to(self, device: torch.device) -> PackedBatch:
        return PackedBatch(self.input_ids.to(device), self.attention_mask.to(device),
                           self.position_ids.to(device), self.response_mask.to(device),
                           self.behaviour_logp.to(device), self.advantages.to(device),
                           self.prompt_len, self.in_loss.to(device), self.rewards.to(device),
                           self.token_rewards.to(device),
                           self.routing.to(device) if self.routing is not None else None)

    def row_tokens(self) -> list[int]:
        """Real (prompt + response) tokens of each row."""
        return self.attention_mask.sum(-1).tolist()


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
        rmask[i, :r] = 1.0 if s.loss_mask is None else torch.tensor(s.loss_mask,
                                                                    dtype=torch.float32)
        beh[i, :r] = torch.tensor(s.behaviour_logprobs)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    in_loss = torch.tensor([float(s.in_loss) for s in samples])
    rewards = torch.tensor([s.learning_reward for s in samples], dtype=torch.float32)
    return PackedBatch(ids, attn, pos, rmask, beh, adv, P, in_loss, rewards,
                       token_rewards(samples, rewards, rmask), pack_routing(samples, P, R))


def token_rewards(samples: list[Sample], rewards: torch.Tensor,
                  rmask: torch.Tensor) -> torch.Tensor:
    """(B, R) each sample's learning reward spread as PPO's GAE reads it: its credit
    (per-turn rewards) where it says, the rest on its last sampled token; a row sums to
    its learning reward."""
    placed = torch.zeros_like(rmask)
    for i, s in enumerate(samples):
        for t, r in s.credit or ():
            placed[i, t] += r
    return placed + terminal_rewards(rewards - placed.sum(-1), rmask)


def pack_routing(samples: list[Sample], P: int, R: int) -> torch.Tensor | None:
    """(B, P+R, L, k) the recorded experts in the loss layout, each sample's from its
    first prompt column on; -1 where none was recorded (pad, each last response token).
    None unless every sample carries routing."""
    if any(s.routing is None for s in samples):
        return None
    _, L, k = samples[0].routing.shape
    out = torch.full((len(samples), P + R, L, k), -1, dtype=torch.int16)
    for i, s in enumerate(samples):
        start = P - len(s.prompt_ids)
        out[i, start:start + len(s.routing)] = torch.from_numpy(s.routing)
    return out


# --------------------------------------------------------------------------- layouts

@dataclass
class ForwardLayout:
    """What the model is called with, and where its outputs for response tokens are."""

    input_ids: torch.Tensor              # (N, T)
    position_ids: torch.Tensor           # (N, T)
    attention_mask: torch.Tensor | None  # (N, T) padded; None packed (positions say it);
                                         # (N, 1, T, T) shared_layout's 4-D mask
    predict_at: torch.Tensor             # (K,) flat index into N*T, one per response token,
                                         # in the row-major order of response_mask
    routing: torch.Tensor | None = None  # (N, T, L, k) recorded experts, -1: none

    @property
    def tokens(self) -> int:
        """Token slots the forward computes, pad included."""
        return self.input_ids.numel()


def padded_layout(batch: PackedBatch) -> ForwardLayout:
    B, S = batch.input_ids.shape
    P, R = batch.prompt_len, batch.response_mask.shape[1]
    cols = torch.arange(P - 1, P - 1 + R, device=batch.input_ids.device)          # (R,)
    flat = torch.arange(B, device=cols.device)[:, None] * S + cols[None, :]        # (B, R)
    return ForwardLayout(batch.input_ids, batch.position_ids, batch.attention_mask,
                         flat[batch.response_mask.bool()], batch.routing)


def bin_rows(lengths: list[int], capacity: int) -> tuple[list[int], list[int], int]:
    """First-fit decreasing: (bin of each row, offset of each row in its bin, bins used).
    Rows longer than ``capacity`` must not be given (the caller sizes capacity)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    free = np.full(len(lengths), capacity, dtype=np.int64)      # at most one bin per row
    used = 0
    row_bin, row_off = [0] * len(lengths), [0] * len(lengths)
    for i in order:
        n = lengths[i]
        b = int(np.argmax(free[:used + 1] >= n))                # bin `used` is still empty
        row_bin[i], row_off[i] = b, capacity - int(free[b])
        free[b] -= n
        used = max(used, b + 1)
    return row_bin, row_off, used


def packed_layout(batch: PackedBatch, row_tokens: int = PACKED_ROW_TOKENS) -> ForwardLayout:
    lengths = batch.row_tokens()

    def binned(capacity: int) -> tuple[list[int], list[int], int, int]:
        row_bin, row_off, n_bins = bin_rows(lengths, capacity)
        T = max(o + n for o, n in zip(row_off, lengths, strict=True))   # the common tail
        return row_bin, row_off, n_bins, T

    # Rows of about one length fill a row_tokens bin badly (6 x 11 > 64): then bins of the
    # longest sequence, mostly one per row, compute fewer slots and need no mask at all.
    row_bin, row_off, n_bins, T = min(binned(max(lengths)),
                                      binned(max(row_tokens, max(lengths))),
                                      key=lambda b: (b[2] * b[3], b[3]))
    device = batch.input_ids.device
    S = batch.input_ids.shape[1]
    P = batch.prompt_len
    real = batch.attention_mask.bool()                                          # (B, S)
    # a row's first real column is P - (its prompt length) (the response mask has holes
    # at a trajectory's observations, so it cannot say where the prompt ends)
    prompt_lens = P - batch.attention_mask.argmax(-1)
    # Row i's real tokens sit at columns [P - p_i, P + r_i) and go to the dense slots
    # bin_i * T + off_i + (column - (P - p_i)).
    start = (torch.tensor(row_bin, device=device) * T + torch.tensor(row_off, device=device)
             - (P - prompt_lens))                                               # (B,)
    dest = start[:, None] + torch.arange(S, device=device)[None, :]            # (B, S)
    ids = torch.zeros(n_bins * T, dtype=batch.input_ids.dtype, device=device)
    pos = torch.zeros(n_bins * T, dtype=batch.position_ids.dtype, device=device)
    ids[dest[real]] = batch.input_ids[real]
    pos[dest[real]] = batch.position_ids[real]
    # Tail pad continues the positions of its row's last sequence rather than starting a
    # sequence of its own: a row holding one sequence then reads as unpacked, and HF runs
    # it with plain causal attention and no mask. Pad after every real token is harmless.
    last = {}
    for i, (b, o) in enumerate(zip(row_bin, row_off, strict=True)):
        if o >= last.get(b, (-1, 0))[0]:
            last[b] = (o, o + lengths[i])
    for b, (first, end) in last.items():
        pos[b * T + end:(b + 1) * T] = torch.arange(end - first, T - first, device=device)
    predict_at = dest[:, P - 1:-1]                       # (B, R): column P+t-1 predicts t
    routing = None
    if batch.routing is not None:
        routing = torch.full((n_bins * T, *batch.routing.shape[2:]), -1,
                             dtype=batch.routing.dtype, device=device)
        routing[dest[real]] = batch.routing[real]
        routing = routing.view(n_bins, T, *batch.routing.shape[2:])
    return ForwardLayout(ids.view(n_bins, T), pos.view(n_bins, T), None,
                         predict_at[batch.response_mask.bool()], routing)


def prompt_groups(batch: PackedBatch) -> list[list[int]]:
    """The rows of each distinct prompt (a GRPO group's completions share theirs), rows in
    order, groups in the order of their first row."""
    P = batch.prompt_len
    starts = batch.attention_mask.argmax(-1).tolist()          # a row's first real column
    ids = batch.input_ids[:, :P].tolist()
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, start in enumerate(starts):
        groups.setdefault(tuple(ids[i][start:]), []).append(i)
    return list(groups.values())


def shared_layout(batch: PackedBatch, row_tokens: int = PACKED_ROW_TOKENS) -> ForwardLayout:
    """The packed layout with each prompt computed once for the rows that share it:

        packed row 0:  [ p p p p a a | b b b | c c ][ q q q d d d d ] ...
                         prompt    one response each  another group

    a response attends to its prompt and to itself (a 4-D mask), and its positions
    continue the prompt's, so every response token sees exactly the context it has in its
    own row: the same logprobs and, through the shared prompt's activations, the same
    gradient (the prompt's share summed over its responses, as the rows' would be). A
    group's responses follow one copy of their prompt while they fit a packed row of the
    capacity packed_layout would pick, so no row is longer than packing makes it; where
    no two responses of a group fit together this is packed_layout itself."""
    lengths = batch.row_tokens()
    P = batch.prompt_len
    prompt_lens = (P - batch.attention_mask.argmax(-1)).tolist()
    groups = prompt_groups(batch)
    if len(groups) == len(batch):                 # no prompt repeats: plain packing
        return packed_layout(batch, row_tokens)

    def segments(capacity: int) -> list[list[int]]:
        out = []
        for rows in groups:
            p, seg, used = prompt_lens[rows[0]], [], 0
            for i in rows:
                r = lengths[i] - p
                if seg and used + r > capacity:
                    out.append(seg)
                    seg, used = [], 0
                seg.append(i)
                used = (used or p) + r
            out.append(seg)
        return out

    def tokens(rows: list[int]) -> int:              # rows of one prompt, after one copy
        return prompt_lens[rows[0]] + sum(lengths[i] - prompt_lens[i] for i in rows)

    def binned(capacity: int):
        segs = segments(capacity)
        seg_len = [tokens(g) for g in segs]
        seg_bin, seg_off, n_bins = bin_rows(seg_len, capacity)
        T = max(o + n for o, n in zip(seg_off, seg_len, strict=True))
        return segs, seg_bin, seg_off, n_bins, T

    longest, cap = max(lengths), max(row_tokens, max(lengths))
    whole = max(tokens(g) for g in groups)               # the longest group in one segment
    segs, seg_bin, seg_off, n_bins, T = min(
        (binned(c) for c in {longest, cap, max(longest, min(whole, cap))}),
        key=lambda b: (b[3] * b[4], b[4]))
    if len(segs) == len(batch):                   # no two responses fit a row together
        return packed_layout(batch, row_tokens)
    device = batch.input_ids.device
    S = batch.input_ids.shape[1]
    # row i, member j (from 0) of segment s: its prompt at the segment's base, its response
    # after the prompt and the responses of members 0..j-1
    base, after, seg_of_row, member = ([0] * len(batch) for _ in range(4))
    for s, rows in enumerate(segs):
        p, at = prompt_lens[rows[0]], prompt_lens[rows[0]]
        for j, i in enumerate(rows):
            base[i] = seg_bin[s] * T + seg_off[s]
            after[i], seg_of_row[i], member[i] = at, s, j + 1
            at += lengths[i] - p

    def t(xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, device=device)

    base, after, plen = t(base)[:, None], t(after)[:, None], t(prompt_lens)[:, None]
    col = torch.arange(S, device=device)[None, :]
    dest = torch.where(col < P, base + col - (P - plen), base + after + col - P)   # (B, S)
    real = batch.attention_mask.bool()
    ids = torch.zeros(n_bins * T, dtype=batch.input_ids.dtype, device=device)
    pos = torch.zeros(n_bins * T, dtype=batch.position_ids.dtype, device=device)
    seg = torch.full((n_bins * T,), -1, dtype=torch.long, device=device)
    part = torch.zeros(n_bins * T, dtype=torch.long, device=device)
    ids[dest[real]] = batch.input_ids[real]
    pos[dest[real]] = batch.position_ids[real]
    seg[dest[real]] = t(seg_of_row)[:, None].expand(-1, S)[real]
    part[dest[real]] = torch.where(col < P, 0, t(member)[:, None]).expand(len(batch), -1)[real]
    seg, part = seg.view(n_bins, 1, T), part.view(n_bins, 1, T)
    sees = ((seg.mT == seg) & (seg >= 0) & ((part == 0) | (part.mT == part))
            & torch.ones(T, T, dtype=torch.bool, device=device).tril())
    sees |= torch.eye(T, dtype=torch.bool, device=device)   # tail pad sees itself only
    predict_at = dest[:, P - 1:-1]                           # column P+t-1 predicts t
    return ForwardLayout(ids.view(n_bins, T), pos.view(n_bins, T), sees[:, None],
                         predict_at[batch.response_mask.bool()])


def shares_prompts(model: torch.nn.Module) -> bool:
    """Whether ``model`` attends by shared_layout's 4-D mask as its own rows would: sdpa
    attention (the mask as given) and full attention in every layer (a sliding window
    would be dropped by a custom mask)."""
    cfg = model.config
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window",
                                                              True) else None
    layer_types = getattr(cfg, "layer_types", None) or ()
    return (getattr(cfg, "_attn_implementation", None) == "sdpa" and not window
            and all(kind == "full_attention" for kind in layer_types))


NO_CUDNN_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                      SDPBackend.MATH]


def attention_kernels(device: torch.device):
    """The sdpa kernels a learner forward may use: on CUDA all but cuDNN's. For a packed
    row's block-diagonal mask torch picks cuDNN attention, which builds an execution plan
    for every new (rows, length) shape, and packed minibatches rarely repeat one: on an
    H200 a packed update of the long-tail recipe took 194 ms against 53 ms padded, nearly
    all of it inside sdpa and its backward (scratch profile, 2026-11-30); without cuDNN it
    takes the memory-efficient kernel, which needs no plan."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel(NO_CUDNN_ATTENTION)


def response_hidden(model: torch.nn.Module, batch: PackedBatch, packed: bool = False,
                    row_tokens: int = PACKED_ROW_TOKENS,
                    router: RouterHooks | None = None) -> torch.Tensor:
    """(K, H) last hidden states of ``model``'s base model at the outputs that predict the
    K response tokens (row-major order of response_mask), in the chosen layout; with
    ``router``, the recorded routing replayed as response_logprobs says."""
    if not packed:
        lay = padded_layout(batch)
    elif batch.routing is None and router is None and shares_prompts(model):
        lay = shared_layout(batch, row_tokens)
    else:
        lay = packed_layout(batch, row_tokens)
    recorded = lay.routing.flatten(0, 1) if lay.routing is not None else None  # (N*T, L, k)
    if router is not None:
        router.route(recorded)
    with attention_kernels(lay.input_ids.device):
        hidden = model.base_model(input_ids=lay.input_ids, attention_mask=lay.attention_mask,
                                  position_ids=lay.position_ids,
                                  use_cache=False).last_hidden_state          # (N, T, H)
    if router is not None:
        router.agreed = (same_experts(router.chosen()[lay.predict_at],
                                      recorded[lay.predict_at])
                         if recorded is not None else None)
    return hidden.reshape(-1, hidden.shape[-1])[lay.predict_at]


def response_values(critic: torch.nn.Module, batch: PackedBatch, packed: bool = False,
                    row_tokens: int = PACKED_ROW_TOKENS) -> torch.Tensor:
    """(B, R) a value model's (engine.learner.critic) estimate V(s_t) of each response
    token's state (the prompt and the response before token t), float32; 0 off the
    response. The head reads the same outputs the policy's LM head does."""
    h = response_hidden(critic, batch, packed, row_tokens)                    # (K, H)
    head = critic.score
    mask = batch.response_mask.bool()
    with torch.autocast(h.device.type, enabled=False):
        v = head(h.to(head.weight.dtype)).float().squeeze(-1)                  # (K,)
    values = torch.zeros(mask.shape, dtype=torch.float32, device=v.device)
    values[mask] = v
    return values


def response_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float,
                      with_entropy: bool = False, packed: bool = False,
                      row_tokens: int = PACKED_ROW_TOKENS, top_p: float = 1.0,
                      router: RouterHooks | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced logprobs (B, R) of the response tokens under the sampling
    distribution (engine.sampling: logits / temperature, then the top-p nucleus, which
    always holds the response token), and optionally the per-token entropy (B, R) of
    that distribution; 0 off the response. ``packed`` chooses the forward layout
    (``row_tokens``: packed_layout's); the result is the same up to float rounding.
    ``router`` (hooks on ``model``'s MoE routers): the forward replays the batch's
    recorded routing if the hooks replay, and ``router.agreed`` says, per response token
    (K,), whether the model's own routing at the position predicting it was the
    recorded one (None when the batch records none)."""
    h = response_hidden(model, batch, packed, row_tokens, router)              # (K, H)
    head = model.get_output_embeddings()
    mask = batch.response_mask.bool()
    targets = batch.input_ids[:, batch.prompt_len:][mask]                       # (K,)
    with torch.autocast(h.device.type, enabled=False):
        logits = head(h.to(head.weight.dtype)).float()                         # (K, V)
        logp_all = processed_logprobs(logits, temperature, top_p, keep=targets)
    logp = torch.zeros(mask.shape, dtype=torch.float32, device=logits.device)
    logp[mask] = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = torch.zeros(mask.shape, dtype=torch.float32, device=logits.device)
        entropy[mask] = token_entropy(logp_all)
    return logp, entropy


def micro_batches(idx: torch.Tensor, costs: list[int], budget: int) -> list[torch.Tensor]:
    """Split the rows ``idx`` (in order) into consecutive runs whose summed ``costs`` (the
    tokens a forward computes for each row) stay within ``budget``; a row over the budget
    alone is a run of its own. ``budget`` 0 = one run."""
    if budget <= 0:
        return [idx]
    runs, start, used = [], 0, 0
    for k, row in enumerate(idx.tolist()):
        if k > start and used + costs[row] > budget:
            runs.append(idx[start:k])
            start, used = k, 0
        used += costs[row]
    runs.append(idx[start:])
    return runs
