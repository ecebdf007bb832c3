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
    from engine.weightsync.fingerprint import SLICE_BYTES, load_fingerprinted

    big = SLICE_BYTES // 4 * 3 + 5                  # float32 elements: spans 4 slices
    served = {"a.big": torch.zeros(big), "b.half": torch.zeros(3, 4, dtype=torch.bfloat16),
              "c.scalar": torch.zeros(()), "d.ids": torch.zeros(7, dtype=torch.int64),
              "e.kept": torch.arange(5.0), "f.cast": torch.zeros(4, dtype=torch.float64),
              "g.strided": torch.zeros(3, 2), "h.conj": torch.zeros(3, dtype=torch.cfloat)}
    sent = [("g.strided", torch.randn(2, 3).t()), ("a.big", torch.randn(big)),
            ("c.scalar", torch.tensor(2.5)), ("d.ids", torch.arange(7) * 3),
            ("b.half", torch.randn(3, 4, dtype=torch.bfloat16)),
            ("f.cast", torch.randn(4)), ("h.conj", torch.randn(3, dtype=torch.cfloat).conj())]
    nbytes, fp = load_fingerprinted(served, sent)
    for name, t in sent:
        assert torch.equal(served[name], t.to(served[name].dtype))
    assert fp == fingerprint(served.items())
    assert nbytes == sum(served[n].numel() * served[n].element_size() for n, _ in sent)
    served["a.big"][-1] += 1                        # the last slice's last byte counts
    assert fingerprint(served.items()) != fp
    assert load_fingerprinted(served, [], verify=False) == (0, "")


def test_a_checkpoint_recorded_with_the_earlier_stream_fingerprint_still_resumes(
        tiny_dir, tmp_path):
    """Checkpoints written before the per-tensor digests record the one-stream fingerprint
    and no scheme: a resume checks them against that; a newer one must match its own."""
    import json

    from engine.learner.checkpoint import read_run_state, write_run_state
    from engine.weightsync.fingerprint import stream_fingerprint

    learner = Learner(load_policy(tiny_dir), GrpoConfig(), 1.0, seed=0)
    write_run_state(tmp_path, learner, tiny_dir, learner.fingerprint())
    state = json.loads((tmp_path / "state.json").read_text())
    assert read_run_state(tmp_path, learner)["fingerprint"] == fingerprint(
        learner.named_tensors()) != stream_fingerprint(learner.named_tensors())
    legacy = {k: v for k, v in state.items() if k != "fingerprint_scheme"}
    for recorded, resumes in ((stream_fingerprint(learner.named_tensors()), True),
                              ("0" * 32, False)):
        for written, scheme in ((legacy, "legacy"), (state, "per-tensor")):
            (tmp_path / "state.json").write_text(json.dumps(written | {"fingerprint": recorded}))
            if resumes and scheme == "legacy":
                read_run_state(tmp_path, learner)
            else:
                with pytest.raises(RuntimeError, match="do not match"):
                    read_run_state(tmp_path, learner)
    (tmp_path / "state.json").write_text(json.dumps(state | {"fingerprint_scheme": 3}))
    with pytest.raises(RuntimeError, match="scheme 3, which this rlplane does not know"):
        read_run_state(tmp_path, learner)


def test_a_load_in_inference_mode_loads_inference_tensors_on_both_threads():
    from engine.weightsync.fingerprint import load_fingerprinted

    with torch.inference_mode():       # the served tensors were made in inference mode
        served = {"a.big": torch.zeros(1 << 18), "b.cast": torch.zeros(4, dtype=torch.float64)}
        sent = [("a.big", torch.ones(1 << 18)), ("b.cast", torch.ones(4))]   # b: the helper
        _, fp = load_fingerprinted(served, sent)
    assert fp == fingerprint(served.items()) and bool((served["b.cast"] == 1).all())


def test_a_load_that_fails_midway_raises_its_error_once_its_other_thread_has_stopped():
    from engine.weightsync.fingerprint import load_fingerprinted

    n = 1 << 21                          # x on this thread, then b; y on the helper
    served = {"x": torch.zeros(n), "y": torch.zeros(n), "b": torch.zeros(3)}
    sent = [("x", torch.ones(n)), ("y", torch.full((n,), 2.0)), ("b", torch.ones(5))]
    with pytest.raises(RuntimeError):                        # b: 5 elements into 3
        load_fingerprinted(served, sent)
    # nothing is still writing the served tensors: the helper's copy is whole
    assert torch.equal(served["x"], torch.ones(n)) and torch.equal(served["y"], sent[1][1])
    served["b"] = torch.zeros(5)
    _, fp = load_fingerprinted(served, sent)                 # the helper still serves
    assert fp == fingerprint(served.items())
