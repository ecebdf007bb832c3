import threading

import pytest
import torch

from engine.config import GrpoConfig
from engine.experience import Sample
from engine.learner.batch import pack
from engine.learner.learner import Learner
from engine.model import load_policy, load_tokenizer
from engine.rollout.base import SamplingParams, WeightReport
from engine.rollout.torch_backend import TorchRollout
from engine.tasks import Problem
from engine.weightsync.fingerprint import fingerprint

from .sync_session import sync_in_place


def _learner_and_engine(tiny_dir):
    learner = Learner(load_policy(tiny_dir), GrpoConfig(lr=1e-2, minibatches=1), 1.0, seed=0)
    engine = TorchRollout.from_pretrained(tiny_dir)
    return learner, engine, load_tokenizer(tiny_dir)


def _one_update(learner, engine, tok):
    prompts = [tok(p)["input_ids"] for p in ["1+2=", "3*4="] for _ in range(4)]
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=4), seed=learner.step)
    samples = [Sample(Problem("", ""), p, o.token_ids, o.logprobs, o.finished, o.version, 0,
                      advantage=(1.0 if i % 2 else -1.0))
               for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    learner.update(pack(samples, tok.pad_token_id))


def test_fingerprints_match_after_every_sync(tiny_dir):
    learner, engine, tok = _learner_and_engine(tiny_dir)
    seen = set()
    for _ in range(3):
        _one_update(learner, engine, tok)
        res = sync_in_place(engine, learner.named_tensors(), learner.version)
        assert res.matched
        assert res.version_rollout == learner.version
        assert res.fingerprint_rollout == engine.fingerprint() == learner.fingerprint()
        seen.add(res.fingerprint_rollout)
    assert len(seen) == 3          # the weights really changed each step


def test_a_corrupted_rollout_tensor_changes_the_fingerprint(tiny_dir):
    learner, engine, _ = _learner_and_engine(tiny_dir)
    sync_in_place(engine, learner.named_tensors(), 0)
    assert engine.fingerprint() == learner.fingerprint()
    engine.tensors["model.layers.2.mlp.up_proj.weight"][3, 7] += 1e-3
    assert engine.fingerprint() != learner.fingerprint()


class _DropsWeights:
    """A rollout engine that acknowledges a sync but keeps serving the old weights."""

    def __init__(self, engine):
        self.engine = engine

    def load_weights(self, named_tensors, version, verify=True):
        list(named_tensors)
        self.engine._version = version
        return WeightReport(version, self.engine.fingerprint(), 0)

    def weight_version(self):
        return self.engine.weight_version()


def test_a_sync_that_silently_did_not_apply_is_reported_as_a_mismatch(tiny_dir):
    learner, engine, tok = _learner_and_engine(tiny_dir)
    _one_update(learner, engine, tok)
    res = sync_in_place(_DropsWeights(engine), learner.named_tensors(), learner.version)
    assert res.version_rollout == learner.version     # the version alone would lie...
    assert not res.matched                            # ...the fingerprint does not


def test_fingerprint_depends_on_names_values_and_dtype():
    a = [("w", torch.ones(3))]
    assert fingerprint(a) == fingerprint([("w", torch.ones(3))])
    assert fingerprint(a) != fingerprint([("v", torch.ones(3))])
    assert fingerprint(a) != fingerprint([("w", torch.ones(3, dtype=torch.float64))])
    assert fingerprint([("a", torch.zeros(1)), ("b", torch.ones(1))]) == \
        fingerprint([("b", torch.ones(1)), ("a", torch.zeros(1))])


def test_loading_an_unknown_tensor_name_fails_loudly(tiny_dir):
    engine = TorchRollout.from_pretrained(tiny_dir)
    with pytest.raises(KeyError):
        engine.load_weights([("model.nope.weight", torch.zeros(1))], 1)


def test_loading_fingerprints_the_served_tensors_as_a_second_pass_would():
    from engine.weightsync.fingerprint import CHUNK_BYTES, load_fingerprinted

    big = CHUNK_BYTES // 4 * 3 + 5                  # float32 elements: spans 4 slices
    served = {"a.big": torch.zeros(big), "b.half": torch.zeros(3, 4, dtype=torch.bfloat16),
              "c.scalar": torch.zeros(()), "d.ids": torch.zeros(7, dtype=torch.int64),
              "e.kept": torch.arange(5.0), "f.cast": torch.zeros(4, dtype=torch.float64),
              "g.strided": torch.zeros(3, 2)}
    sent = [("g.strided", torch.randn(2, 3).t()), ("a.big", torch.randn(big)),
            ("c.scalar", torch.tensor(2.5)), ("d.ids", torch.arange(7) * 3),
            ("b.half", torch.randn(3, 4, dtype=torch.bfloat16)),
            ("f.cast", torch.randn(4))]
    nbytes, fp = load_fingerprinted(served, sent)
    for name, t in sent:
        assert torch.equal(served[name], t.to(served[name].dtype))
    assert fp == fingerprint(served.items())
    assert nbytes == sum(served[n].numel() * served[n].element_size() for n, _ in sent)
    served["a.big"][-1] += 1                        # the last slice's last byte counts
    assert fingerprint(served.items()) != fp
    assert load_fingerprinted(served, [], verify=False) == (0, "")


def test_a_load_that_fails_midway_raises_its_error_and_leaves_no_hashing_thread():
    from engine.weightsync.fingerprint import load_fingerprinted

    served = {"a": torch.zeros(4), "b": torch.zeros(3)}
    with pytest.raises(RuntimeError):                        # b: 5 elements into 3
        load_fingerprinted(served, [("a", torch.ones(4)), ("b", torch.ones(5))])
    assert torch.equal(served["a"], torch.ones(4))
    assert not [t for t in threading.enumerate() if t.name == "rlplane-fingerprint"]
