"""The torch rollout backend against the learner's teacher-forced recompute (the oracle
relation every other backend is held to)."""

import pytest
import torch

from engine.experience import Sample
from engine.learner.batch import pack, response_logprobs
from engine.model import load_policy, load_tokenizer
from engine.rollout.base import SamplingParams
from engine.rollout.torch_backend import TorchRollout, prefill_buckets, sample_next
from engine.tasks import Problem

PROMPTS = ["12+34=", "1*2=", "987*654=", "rev:abcdefgh=", "5-9="]   # different lengths


@pytest.fixture(scope="module")
def parts(tiny_dir):
    return TorchRollout.from_pretrained(tiny_dir), load_policy(tiny_dir).eval(), \
        load_tokenizer(tiny_dir)


def _recompute(model, tok, prompts, outs, temperature, top_p=1.0, packed=False):
    samples = [Sample(problem=Problem("", ""), prompt_ids=p, response_ids=o.token_ids,
                      behaviour_logprobs=o.logprobs, finished=o.finished, version=0, group=0)
               for p, o in zip(prompts, outs, strict=True)]
    batch = pack(samples, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch, temperature, top_p=top_p, packed=packed)
    return logp, batch


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9), (0.7, 0.9)])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_behaviour_logprobs_equal_the_learners_recompute(parts, temperature, top_p, packed):
    engine, model, tok = parts
    prompts = [tok(p)["input_ids"] for p in PROMPTS] * 4
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12)
    outs = engine.generate(prompts, params, seed=3)
    learner, batch = _recompute(model, tok, prompts, outs, temperature, top_p, packed)
    behaviour = batch.behaviour_logp
    mask = batch.response_mask.bool()
    assert mask.sum() > 40
    assert (learner - behaviour).abs()[mask].max() < 1e-4


def test_a_full_vocabulary_recompute_of_a_top_p_run_carries_the_nucleus_mass(parts):
    engine, model, tok = parts
    prompts = [tok(p)["input_ids"] for p in PROMPTS] * 4
    outs = engine.generate(prompts, SamplingParams(top_p=0.9, max_new_tokens=12), seed=3)
    full, batch = _recompute(model, tok, prompts, outs, 1.0)
    mask = batch.response_mask.bool()
    # What the learner computed before it replayed top-p: off by -log(kept mass) per
    # token, an entropy-dependent bias (about -log 0.9 on this near-uniform model).
    gap = (batch.behaviour_logp - full)[mask]
    assert gap.min() > 0 and gap.mean() > 0.05


def test_logprobs_are_temperature_scaled(parts):
    engine, model, tok = parts
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    outs = engine.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=6), seed=0)
    at_one, batch = _recompute(model, tok, prompts, outs, 1.0)
    mask = batch.response_mask.bool()
    # An unscaled recompute disagrees: the bug the test above guards against.
    assert (at_one - batch.behaviour_logp).abs()[mask].max() > 1e-2


def test_top_p_samples_inside_the_nucleus_with_renormalized_logprobs():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    gen = torch.Generator().manual_seed(0)
    ids, lp = sample_next(logits, temperature=1.0, top_p=0.75, generator=gen)
    assert set(ids.tolist()) == {0, 1}                     # 0.5 + 0.3 covers 0.75
    expected = torch.log(torch.tensor([0.5, 0.3]) / 0.8)
    assert torch.allclose(lp, expected[ids], atol=1e-6)


def test_greedy_is_deterministic_and_has_point_mass_logprobs(parts):
    engine, _, tok = parts
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    a = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8), seed=1)
    b = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8), seed=2)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert all(lp == 0.0 for o in a for lp in o.logprobs)


def test_padding_does_not_change_a_prompts_completion(parts):
    engine, _, tok = parts
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    batched = engine.generate(prompts, params, seed=0)
    for p, o in zip(prompts, batched, strict=True):
        [alone] = engine.generate([p], params, seed=0)
        assert alone.token_ids == o.token_ids


def test_generation_stops_at_eos_and_reports_why(parts):
    engine, _, tok = parts
    prompts = [tok(p)["input_ids"] for p in PROMPTS] * 20
    outs = engine.generate(prompts, SamplingParams(temperature=1.5, max_new_tokens=16), seed=5)
    eos = tok.eos_token_id
    assert any(o.finished for o in outs) and any(not o.finished for o in outs)
    for o in outs:
        assert len(o.token_ids) == len(o.logprobs) <= 16
        assert eos not in o.token_ids[:-1]
        assert o.finished == (o.token_ids[-1] == eos)
        assert o.finished or len(o.token_ids) == 16


def test_ignore_eos_forces_the_full_budget(parts):
    engine, _, tok = parts
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=9, ignore_eos=True), seed=0)
    assert all(len(o.token_ids) == 9 for o in outs)


def check_streaming(engine, prompts, params, seed):
    """on_complete sees every completion once, as it ends, and changes nothing."""
    plain = engine.generate(prompts, params, seed=seed)
    seen: list[tuple[int, object]] = []
    outs = engine.generate(prompts, params, seed=seed, on_complete=lambda i, c: seen.append((i, c)))
    assert sorted(i for i, _ in seen) == list(range(len(prompts)))
    assert all(outs[i] is c for i, c in seen)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert not any(o.aborted for o in outs)
    return [len(c.token_ids) for _, c in seen]


def check_stop(engine, prompts, params, seed, keep, budgets=None):
    """A True from on_complete stops the call: the rest come back as aborted prefixes."""
    full = engine.generate(prompts, params, seed=seed, budgets=budgets)
    done: list[int] = []
    outs = engine.generate(prompts, params, seed=seed, budgets=budgets,
                           on_complete=lambda i, c: done.append(i) or len(done) >= keep)
    aborted = [i for i, o in enumerate(outs) if o.aborted]
    assert len(done) >= keep and aborted and set(aborted).isdisjoint(done)
    assert len(done) + len(aborted) == len(prompts)
    for i in aborted:
        o = outs[i]
        assert not o.finished and len(o.token_ids) == len(o.logprobs)
        assert len(o.token_ids) < len(full[i].token_ids)
        assert o.token_ids == full[i].token_ids[:len(o.token_ids)]


def test_on_complete_streams_completions_in_the_order_they_finish(parts):
    engine, _, tok = parts
    prompts = [tok(p)["input_ids"] for p in PROMPTS] * 8
    lengths = check_streaming(engine, prompts, SamplingParams(temperature=1.5,
                                                              max_new_tokens=16), seed=5)
    assert lengths == sorted(lengths)         # one decode step at a time: shortest first


def test_on_complete_returning_true_stops_and_returns_aborted_partials(parts):
    engine, _, tok = parts
    prompts = [tok(p)["input_ids"] for p in PROMPTS] * 8
    check_stop(engine, prompts, SamplingParams(temperature=1.5, max_new_tokens=16), seed=5,
               keep=10)


def test_each_rows_own_budget_ends_it_and_completes_it(parts):
    engine, _, tok = parts
    prompts = [tok(p)["input_ids"] for p in PROMPTS[:2]]
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    ended: list[int] = []
    outs = engine.generate(prompts, params, seed=0, budgets=[3, 8],
                           on_complete=lambda i, c: ended.append(len(c.token_ids)))
    assert [len(o.token_ids) for o in outs] == ended == [3, 8]
    assert outs[0].token_ids == engine.generate(prompts, params, seed=0)[0].token_ids[:3]
    with pytest.raises(ValueError, match="budgets"):
        engine.generate(prompts, params, seed=0, budgets=[0, 9])


def test_prefill_buckets_split_sorted_rows_where_prompts_get_much_shorter():
    # a bucket takes 8 rows before it may end, wherever the lengths drop
    assert prefill_buckets([40] * 3 + [20] * 9 + [19] * 2 + [3] * 8) == [
        (0, 8, 40), (8, 16, 20), (16, 22, 3)]
    assert prefill_buckets([40] * 8 + [20] * 9 + [3] * 7) == [
        (0, 8, 40), (8, 17, 20), (17, 24, 3)]
    assert prefill_buckets([40] * 8 + [31] * 9) == [(0, 17, 40)]     # not 3/4 shorter
    assert prefill_buckets([5]) == [(0, 1, 5)]


def test_a_bucketed_prefill_samples_what_one_padded_prefill_samples(parts, tiny_dir):
    """Prompts of 3 to ~60 tokens, in mixed order: the hand-written forward prefills them in
    length buckets, transformers' own forward in one padded batch; same tokens, same
    logprobs (to rounding)."""
    engine, _, tok = parts
    texts = [f"rev:{'abcdefgh' * k}=" for k in (0, 7, 1, 3, 0, 5, 2, 7, 1, 0, 4, 6)] * 3
    prompts = [tok(t)["input_ids"] for t in texts]
    lengths = sorted((len(p) for p in prompts), reverse=True)
    assert len(prefill_buckets(lengths)) >= 2
    params = SamplingParams(temperature=1.0, max_new_tokens=9)
    fast = engine.generate(prompts, params, seed=5)
    generic = TorchRollout.from_pretrained(tiny_dir, forward="hf").generate(prompts, params,
                                                                            seed=5)
    assert [o.token_ids for o in fast] == [o.token_ids for o in generic]
    for a, b in zip(fast, generic, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def test_a_group_prefills_its_prompt_once_and_samples_what_a_prefill_per_row_samples(
        parts, monkeypatch):
    engine, _, tok = parts
    prompts = [tok(t)["input_ids"] for t in PROMPTS for _ in range(4)]    # groups of 4
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    rows, prefill = [], engine._prefill
    monkeypatch.setattr(engine, "_prefill",
                        lambda pre, *a, **k: rows.append(len(pre)) or prefill(pre, *a, **k))
    shared = engine.generate(prompts, params, seed=3)
    monkeypatch.setattr(engine, "share_prefixes", False)
    per_row = engine.generate(prompts, params, seed=3)
    assert rows == [len(PROMPTS), len(prompts)]
    assert [o.token_ids for o in shared] == [o.token_ids for o in per_row]
    assert len({tuple(o.token_ids) for o in shared}) > len(PROMPTS)   # groups still differ
    for a, b in zip(shared, per_row, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


def _next_turn(tok, prompts, outs, observation="up:"):
    """Each context continued as a multi-turn trajectory's next turn: turn + observation."""
    return [p + o.token_ids + tok(observation, add_special_tokens=False)["input_ids"]
            for p, o in zip(prompts, outs, strict=True)]


def _widths(engine, monkeypatch):
    """The width of every prefill window (a forward of more than one token) from now on."""
    seen, forward = [], engine.model.forward
    monkeypatch.setattr(engine.model, "forward", lambda ids, *a, **k: (
        seen.append(ids.shape[1]) if ids.shape[1] > 1 else None) or forward(ids, *a, **k))
    return seen


def check_turns(engine, plain, tok, contexts, monkeypatch, observation="up:", turns=3,
                miss=False):
    """``turns`` turns, an observation after each: with the prefix cache each next turn
    feeds the last token and the observation only (no prefill window half as wide as the
    shortest context), and samples the same tokens, to rounding the same logprobs, as
    ``plain``, an engine without one that prefills every context whole. ``miss``: each
    next turn's batch also holds a context the cache has not seen, as long as its middle
    one (the prefill's window is then that wide, and shorter stored rows fit in it)."""
    params = SamplingParams(temperature=1.0, max_new_tokens=6, continues=True)
    for turn in range(turns):
        widths = _widths(engine, monkeypatch)
        batch = list(contexts)
        if turn and miss:
            middle = sorted(len(c) for c in contexts)[len(contexts) // 2]
            batch.append(tok("rev:" + "hgfedcba" * 8, add_special_tokens=False)[
                "input_ids"][:middle])
        a = engine.generate(batch, params, seed=turn)
        b = plain.generate(batch, params, seed=turn)
        assert [o.token_ids for o in a] == [o.token_ids for o in b]
        for x, y in zip(a, b, strict=True):
            assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
        if turn and not miss:
            assert max(widths) < min(len(c) for c in contexts) // 2, widths
        contexts = _next_turn(tok, contexts, a[:len(contexts)], observation)


def test_a_continued_context_feeds_only_its_new_tokens_and_samples_what_a_full_prefill_does(
        parts, tiny_dir, monkeypatch):
    """Three turns of groups of 4 (check_turns) on the hand-written Llama forward, then
    three with a context the cache has not seen in each batch."""
    engine, _, tok = parts
    plain = TorchRollout.from_pretrained(tiny_dir, prefix_cache_mb=0)
    for miss in (False, True):
        check_turns(engine, plain, tok, [tok(p)["input_ids"] for p in PROMPTS for _ in range(4)],
                    monkeypatch, miss=miss)


def test_new_weights_drop_the_prefix_cache(tiny_dir, monkeypatch):
    """KV computed under the weights a sync replaced is never reused: after a load, the
    next turn samples what an engine that only ever had the new weights samples."""
    tok = load_tokenizer(tiny_dir)
    engine = TorchRollout.from_pretrained(tiny_dir)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(temperature=1.0, max_new_tokens=6, continues=True)
    engine.generate(prompts, SamplingParams(max_new_tokens=6), seed=0)
    assert len(engine.prefixes) == 0           # a call no one continues keeps nothing
    first = engine.generate(prompts, params, seed=0)
    assert len(engine.prefixes) == len(prompts)
    gen = torch.Generator().manual_seed(1)
    new = {n: t + 0.05 * torch.randn(t.shape, generator=gen) for n, t in engine.tensors.items()}
    engine.load_weights(new.items(), version=1)
    fresh = TorchRollout.from_pretrained(tiny_dir, prefix_cache_mb=0)
    fresh.load_weights(new.items(), version=1)
    widths = _widths(engine, monkeypatch)
    nxt = _next_turn(tok, prompts, first)
    a, b = engine.generate(nxt, params, seed=1), fresh.generate(nxt, params, seed=1)
    assert max(widths) == max(len(c) for c in nxt)          # every context fed whole
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert engine.sleep() and not engine.prefixes.used     # colocated: released, and said


def test_the_prefix_cache_keeps_the_latest_within_its_bytes_and_gives_the_longest_prefix():
    from engine.rollout.prefix_cache import PrefixCache

    def kv(n):                                    # 2 x n x 4 bytes
        return torch.zeros(n), torch.zeros(n)

    cache = PrefixCache(capacity=100)
    cache.put((1, 2), kv(4), epoch=0)
    cache.put((1, 2, 3, 4), kv(4), epoch=0)
    cache.put((9,), kv(4), epoch=1)               # a call begun under replaced weights
    assert cache.take([1, 2, 3, 4]) is not None and cache.take([1, 2, 3, 4]) is None
    n, _ = cache.take([1, 2, 3, 4, 5])           # the longest proper prefix, removed
    assert n == 4 and cache.take([1, 2, 3, 4, 5]) is None and len(cache) == 0
    for i in range(5):                            # 32 bytes each: the oldest two go
        cache.put((i, 0), kv(4), epoch=0)
    assert len(cache) == 3 and cache.used == 96
    assert cache.take([0, 0, 1]) is None and cache.take([4, 0, 1])[0] == 2
    cache.put((7, 7), kv(20), epoch=0)           # larger than the whole cache: not kept
    assert cache.take([7, 7, 7]) is None
    assert cache.invalidate() == 64 and cache.epoch == 1 and len(cache) == 0
    rows = torch.zeros(2, 3), torch.zeros(2, 3)  # one copy of two rows: 48 bytes, once
    cache.put((1,), (rows[0][0], rows[1][0]), epoch=1)
    cache.put((2,), (rows[0][1], rows[1][1]), epoch=1)
    assert cache.used == 48
    cache.take([1, 1])
    assert cache.used == 48                       # the other row still views that copy
    cache.take([2, 2])
    assert cache.used == 0
