"""Rollout backend "torch": batched sampling over a KV cache, for any causal LM.

The fallback engine and the oracle for other backends. The forward is the hand-written
Llama over a preallocated cache (engine.rollout.llama_kv) where it reproduces the model,
else the model's own forward over transformers' cache (engine.rollout.hf_kv). One call:

    prefill all prompts (left-padded to P)  ->  loop t < max_new_tokens (or the largest
                                               of the rows' own budgets):
        logits (B, V) -> processed logprobs (engine.sampling: / temperature, top-p)
        -> sample -> record token + its logprob under that distribution
        -> rows that sampled EOS or a stop token id (SamplingParams.stop_token_ids: the
           chat template's end of turn) finish (on_complete(i, completion) for each; True
           stops the call and returns the rows still running as aborted partials);
           the batch is compacted once a quarter of it has finished (each compaction
           copies the KV cache; until then finished rows ride along, their tokens unused)
        -> decode one token for the rows still running

The hand-written Llama prefills the rows sorted by prompt length, in buckets of similar
length, each bucket only as wide as its longest prompt (its keys land at the same slots of
the one cache): a batch of mostly short prompts, or of partial rollout's carried rows
(prompt + tokens so far), no longer computes every row at the longest's width.

A call that continues a context fed before (a multi-turn trajectory's next turn: the
context, its last token, the observations) takes that context's KV from the prefix cache
(engine.rollout.prefix_cache; rollout.prefix_cache_mb) into its slots and feeds only the
rest: the prefill buckets go by what each row still has to feed. A call whose params say
it will be continued (SamplingParams.continues) stores each row's KV there as it ends; a
weight load drops them all.

Behaviour logprobs are the log-probabilities of the sampled tokens under the distribution
actually sampled from: temperature-scaled, then truncated to the top-p nucleus and
renormalized (vLLM's processed logprobs). At temperature 0 decoding is greedy and every
logprob is 0 (a point mass). The learner recomputes the same distribution
(engine.sampling), so at any top_p the two agree to rounding.

With ``record_routing`` (an MoE model, rollout.record_routing) every forward also records
the experts each router chose per token (engine.moe.RouterHooks), into a (B, S, L, k)
buffer by slot; a completion carries the slots its row fed: prompt, then its tokens
but the last.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from engine.config import TorchRolloutConfig
from engine.model import eos_token_ids, load_policy
from engine.moe import RouterHooks
from engine.rollout.base import (
    Completion,
    OnComplete,
    PrefixTokens,
    SamplingParams,
    WeightReport,
)
from engine.rollout.hf_kv import HFKV
from engine.rollout.llama_kv import LlamaKV
from engine.rollout.prefix_cache import PrefixCache
from engine.sampling import processed_logprobs
from engine.weightsync.fingerprint import fingerprint, load_fingerprinted


def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` (B, V). Returns ids (B,), logprobs (B,)."""
    logits = logits.float()
    if temperature == 0.0:
        return logits.argmax(-1), torch.zeros(logits.shape[0])
    logp = processed_logprobs(logits, temperature, top_p)                 # (B, V)
    ids = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1)


COMPACT_EVERY = 4      # compact the batch once 1/4 of its rows have finished
PREFIX_CACHE_MB = TorchRolloutConfig.model_fields["prefix_cache_mb"].default


def prefill_buckets(lengths: list[int], min_rows: int = 8,
                    shrink: float = 0.75) -> list[tuple[int, int, int]]:
    """(first row, end row, width) slices of rows sorted by descending prompt length: a
    new bucket starts once a prompt is under ``shrink`` x its bucket's width and the
    bucket has ``min_rows`` (each forward has a fixed cost, too small ones do not pay)."""
    out, a = [], 0
    for j in range(1, len(lengths) + 1):
        if j == len(lengths) or (lengths[j] < shrink * lengths[a] and j - a >= min_rows):
            out.append((a, j, lengths[a]))
            a = j
    return out


class TorchRollout(PrefixTokens):
    """Holds its own copy of the weights; ``load_weights`` is the only way they change."""

    share_prefixes = True     # prefill a prompt repeated in a call once (generate)

    def __init__(self, model: LlamaKV | HFKV, tensors: dict[str, torch.Tensor],
                 eos_ids: Iterable[int], pad_id: int, version: int = 0,
                 router: RouterHooks | None = None, prefix_cache_bytes: int = 0):
        """``tensors``: the HF-named parameters ``model`` computes with (this engine's own
        copy); ``eos_ids``: what ends a completion whatever the sampling params say;
        ``router``: hooks on ``model``'s routers, to record routing;
        ``prefix_cache_bytes``: what the prefix cache may hold (0: none; nor for a model
        whose cache cannot take a stored prefix, nor while recording routing)."""
        self.model, self.tensors, self.router = model, tensors, router
        self.eos_ids = tuple(eos_ids)
        self.pad_id = pad_id
        self.dtype = next(iter(tensors.values())).dtype
        self._version = version
        self.prefixes = (PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 and
                         model.reuses_prefixes and router is None else None)
        PrefixTokens.__init__(self)

    @classmethod
    def from_pretrained(cls, path: Path, dtype: torch.dtype = torch.float32,
                        trust_remote_code: bool = False, forward: str = "auto",
                        record_routing: bool = False,
                        prefix_cache_mb: int = PREFIX_CACHE_MB) -> TorchRollout:
        """``forward``: "auto" takes the hand-written Llama where it reproduces the model,
        "hf" always the model's own forward (for comparing the two). ``record_routing``:
        completions carry the MoE routing (the model's own forward; a dense model is
        refused). ``prefix_cache_mb``: rollout.prefix_cache_mb."""
        policy = load_policy(path, dtype, trust_remote_code)
        config = policy.config
        eos = eos_token_ids(path)
        # Pad slots are masked everywhere; any id in the vocabulary will do.
        pad = config.pad_token_id if config.pad_token_id is not None else (eos or (0,))[0]
        cache_bytes = prefix_cache_mb * 2**20
        if forward == "auto" and LlamaKV.supports(config) and not record_routing:
            tensors = {n: p.detach() for n, p in policy.named_parameters()}
            return cls(LlamaKV(config, tensors), tensors, eos, pad,
                       prefix_cache_bytes=cache_bytes)
        hf = HFKV(policy)
        return cls(hf, hf.tensors(), eos, pad,
                   router=RouterHooks(policy) if record_routing else None,
                   prefix_cache_bytes=cache_bytes)

    # ------------------------------------------------------------------ weights

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                     version: int, verify: bool = True) -> WeightReport:
        if self.prefixes is not None:
            self.prefixes.invalidate()      # KV of the weights being replaced (even in part)
        # one pass: copied and hashed together (KeyError names an unknown tensor)
        nbytes, fp = load_fingerprinted(self.tensors, named_tensors, verify)
        self._version = version
        return WeightReport(version=version, fingerprint=fp, bytes=nbytes)

    def weight_version(self) -> int:
        return self._version

    def fingerprint(self) -> str:
        return fingerprint(self.tensors.items())

    def sleep(self) -> bool:
        """Releases the prefix cache (the learner's update makes it stale anyway); True
        when it held something."""
        return self.prefixes is not None and self.prefixes.invalidate() > 0

    def wake_up(self) -> None:
        pass

    # ------------------------------------------------------------------ sampling

    def _prefill(self, prompts: list[list[int]], P: int, S: int, count: bool = False):
        """The prompts' forward into a new cache of S slots, each left-padded to P:
        (last logits (B, V), valid slots (B, S), next positions (B,), cache). A prompt
        that continues a context in the prefix cache has that context's KV put in its
        slots, and only the rest is fed (``count``: into prefix_stats)."""
        B = len(prompts)
        taken = ([self.prefixes.take(p) for p in prompts] if self.prefixes is not None
                 else [None] * B)
        fed = [len(p) - (hit[0] if hit else 0) for p, hit in zip(prompts, taken, strict=True)]
        # for the prefill, batch row j holds prompt order[j]: buckets need contiguous rows
        order, buckets = torch.arange(B), []
        if self.router is None and isinstance(self.model, LlamaKV):
            order = torch.tensor(sorted(range(B), key=lambda i: -fed[i]))
            buckets = prefill_buckets([fed[i] for i in order.tolist()])
            if len(buckets) == 1:                   # one width: no reordering
                order, buckets = torch.arange(B), [(0, B, max(fed))]
        ids = torch.full((B, P), self.pad_id, dtype=torch.long)
        valid = torch.zeros((B, S), dtype=torch.bool)
        for j, i in enumerate(order.tolist()):
            ids[j, P - len(prompts[i]):] = torch.tensor(prompts[i])
            valid[j, P - len(prompts[i]):P] = True
        positions = (valid[:, :P].long().cumsum(-1) - 1).clamp(min=0)     # (B, P)
        next_pos = valid[:, :P].sum(-1)                                    # (B,)
        cache = self.model.new_cache(B, S, self.dtype)
        if not buckets:            # the model's own forward: one window, what all rows feed
            w = max(fed)
            # the stored slots left of it put into the cache first (a row that fits in the
            # window whole, stored or not, is computed there)
            left = [(i, P - len(p), hit[1]) for i, (p, hit) in
                    enumerate(zip(prompts, taken, strict=True)) if hit and len(p) > w]
            if left:
                self.model.preload(cache, B, P - w, left)
            if count:
                self._count(prompts, [w] * B)
            logits = self.model.forward(ids[:, P - w:], positions[:, P - w:], cache, P - w,
                                        valid, last_only=True)[:, -1]
            return logits, valid, next_pos, cache
        for j, i in enumerate(order.tolist()):
            if taken[i] is not None:
                self.model.put(cache, j, P - len(prompts[i]), taken[i][1])
        if count:
            widths = [0] * B
            for a, b, w in buckets:
                for i in order[a:b].tolist():
                    widths[i] = w
            self._count(prompts, widths)
        # A bucket's forward writes its whole width: a row fed fewer tokens has some of its
        # stored slots computed again, from the same tokens over the same keys (equal).
        logits = torch.cat([
            self.model.forward(ids[a:b, P - w:], positions[a:b, P - w:],
                               self.model.rows(cache, a, b), P - w, valid[a:b],
                               last_only=True)[:, -1]
            for a, b, w in buckets])
        if order.equal(torch.arange(B)):
            return logits, valid, next_pos, cache
        # back to the prompts' order: sampling draws per row in it, as unbucketed
        back = torch.argsort(order)
        return logits[back], valid[back], next_pos[back], self.model.select(cache, back)

    def _count(self, prompts: list[list[int]], widths: list[int]) -> None:
        """prefix_stats: the tokens of ``prompts`` and those left of each one's window
        (``widths``), which the prefill did not compute (its stored KV served them)."""
        self._counted(sum(max(0, len(p) - w) for p, w in zip(prompts, widths, strict=True)),
                      sum(len(p) for p in prompts))

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int,
                 on_complete: OnComplete | None = None,
                 budgets: list[int] | None = None) -> list[Completion]:
        gen = torch.Generator().manual_seed(seed)
        epoch = self.prefixes.epoch if self.prefixes is not None else 0
        store = self.prefixes is not None and params.continues
        B, P = len(prompts), max(len(p) for p in prompts)
        cap = torch.tensor(budgets if budgets else [params.max_new_tokens] * B)   # (B,)
        if bool((cap < 1).any()) or bool((cap > params.max_new_tokens).any()):
            raise ValueError(f"budgets must lie in [1, max_new_tokens = "
                             f"{params.max_new_tokens}], got {sorted(set(cap.tolist()))}")
        steps = int(cap.max())
        S = P + steps
        # A group's completions share their prompt: each distinct prompt is prefilled once
        # and its cache rows copied to its group (vLLM shares them through its prefix
        # cache), so a group of 8 costs one prompt's prefill, not 8. Routing is recorded
        # per row, so a recording engine prefills every row.
        first: dict[tuple[int, ...], int] = {}
        group = torch.tensor([first.setdefault(tuple(p), len(first)) for p in prompts])
        shared = self.share_prefixes and self.router is None and len(first) < B
        pre = [list(p) for p in first] if shared else prompts
        logits, valid, next_pos, cache = self._prefill(pre, P, S, count=store)
        if shared:
            logits, valid, next_pos = logits[group], valid[group], next_pos[group]
            cache = self.model.select(cache, group)
        routing = None
        if self.router is not None:   # (B, S, L, k) by slot; -1 where nothing was fed
            routing = torch.full((B, S, self.router.layers, self.router.top_k), -1,
                                 dtype=torch.int16)
            routing[:, :P] = self.router.chosen().view(B, P, self.router.layers, -1)
        stop_ids = torch.tensor(sorted({*self.eos_ids, *params.stop_token_ids}), dtype=torch.long)

        out_tok = torch.full((B, params.max_new_tokens), self.pad_id, dtype=torch.long)
        out_lp = torch.zeros((B, params.max_new_tokens))
        lengths = torch.zeros(B, dtype=torch.long)
        finished = torch.zeros(B, dtype=torch.bool)
        results: list[Completion | None] = [None] * B

        def complete(i: int, aborted: bool = False) -> bool:
            n = int(lengths[i])
            fed = (routing[i, P - len(prompts[i]):P + n - 1].numpy().copy()
                   if routing is not None else None)
            results[i] = Completion(token_ids=out_tok[i, :n].tolist(),
                                    logprobs=out_lp[i, :n].tolist(), finished=bool(finished[i]),
                                    version=self._version, aborted=aborted, routing=fed)
            return bool(on_complete(i, results[i])) if on_complete and not aborted else False

        rows = torch.arange(B)            # original row of each batch row
        alive = torch.ones(B, dtype=torch.bool)   # batch rows still generating
        for t in range(steps):
            tok, lp = sample_next(logits, params.temperature, params.top_p, gen)
            live = alive.nonzero().squeeze(-1)
            mine, tok_l = rows[live], tok[live]
            out_tok[mine, t], out_lp[mine, t] = tok_l, lp[live]
            lengths[mine] = t + 1
            done = torch.isin(tok_l, stop_ids)
            if params.ignore_eos:
                done = torch.zeros_like(done)
            finished[mine[done]] = True
            done = done | (cap[mine] <= t + 1)              # a row's budget ends it
            stop = False
            if store:
                self._keep(cache, live[done], mine[done], prompts, out_tok, P, t, epoch)
            for i in mine[done].tolist():
                stop = complete(i) or stop
            if stop:
                if store:
                    self._keep(cache, live[~done], mine[~done], prompts, out_tok, P, t, epoch)
                for i in mine[~done].tolist():
                    complete(i, aborted=True)
                break
            alive[live[done]] = False
            if not bool(alive.any()):
                break
            # compact once a quarter of the batch has finished: finished rows stop costing
            # compute, and the cache is copied a few times per call, not at every finish
            if int((~alive).sum()) * COMPACT_EVERY >= len(alive):
                keep = alive.nonzero().squeeze(-1)
                rows, tok, next_pos, valid = rows[keep], tok[keep], next_pos[keep], valid[keep]
                alive = alive[keep]
                cache = self.model.select(cache, keep)
            slot = P + t
            valid[:, slot] = True
            logits = self.model.forward(tok[:, None], next_pos[:, None], cache, slot, valid)[:, -1]
            if routing is not None:
                routing[rows[alive], slot] = self.router.chosen()[alive].to(torch.int16)
            next_pos = next_pos + 1
        return results  # type: ignore[return-value]  # every row completed above

    def _keep(self, cache, batch_rows: torch.Tensor, rows: torch.Tensor,
              prompts: list[list[int]], out_tok: torch.Tensor, P: int, t: int,
              epoch: int) -> None:
        """The KV of the batch rows ``batch_rows`` (the prompts ``rows``), ending at step
        ``t``, into the prefix cache: what each fed, its prompt and its first t tokens
        (the last sampled is not fed yet), at slots [P - len(prompt), P + t). They are
        copied out together, a slice of rows at a time (each a small share of the cache's
        bytes), and each entry is a view of its slice's copy."""
        row_bytes = (P + t) * self.model.slot_bytes(cache)
        if not len(rows) or row_bytes > self.prefixes.capacity:     # none would be kept
            return
        per = max(1, self.prefixes.capacity // (8 * row_bytes))
        for c in range(0, len(rows), per):
            kv = self.model.take(cache, batch_rows[c:c + per], P + t)
            for j, i in enumerate(rows[c:c + per].tolist()):
                a = P - len(prompts[i])
                self.prefixes.put((*prompts[i], *out_tok[i, :t].tolist()),
                                  tuple(x[:, j, :, a:] for x in kv), epoch)
