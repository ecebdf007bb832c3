"""What a real tokenizer does differently from the built-in character one, on the path a
model.path checkpoint takes (tiny random models with a byte-level BPE tokenizer and a
ChatML template, tests/engine/hf_models.py). What was checked, and what was fixed:

- prompt/completion boundary: every part (warm start, sampler, learner, evaluation)
  encodes the prompt alone and continues it with ids, so what is trained is what is
  sampled; on the shipped GSM8K-format sample (raw and chat-rendered) and arithmetic,
  prompt + demonstration encoded jointly gives the same ids as encoded apart.
- prompts ending in an EOS the tokenizer appends (add_eos_token): fixed, encode_prompt.
- stop ids: EOS, generation_config's EOS list and the template's end of turn
  (tests/engine/test_hf_models.py); the warm start ended chat turns with EOS instead of
  the template's end of turn: fixed, demonstration_end.
- the warm start's loss covers the demonstration and its end token, never the prompt.
- padding: left-padded prompts and right-padded completions compute what each sequence
  computes alone, in the sampler and in both learner layouts."""

import pytest
import torch

from engine.config import ArithmeticTaskConfig
from engine.experience import Sample
from engine.learner.batch import pack, response_logprobs
from engine.learner.warmstart import demonstration_sample
from engine.model import encode_prompt, load_policy, load_tokenizer
from engine.orchestration.evaluation import evaluate
from engine.rollout.base import Completion, SamplingParams
from engine.rollout.torch_backend import TorchRollout
from engine.tasks import Problem, build_task, task_for

from .hf_models import EOS, IM_END, build_hf_model
from .test_dataset_task import ROWS, jsonl, run_cfg


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    """Its tokenizer's EOS is <|endoftext|>, its template ends a turn with <|im_end|>."""
    return build_hf_model(tmp_path_factory.mktemp("hf") / "qwen2", "qwen2")


def trained_text(tok, sample: Sample) -> str:
    """The tokens the warm start's loss covers, as text (special tokens kept)."""
    batch = pack([sample], tok.pad_token_id)
    targets = batch.input_ids[0, batch.prompt_len:][batch.response_mask[0].bool()]
    return tok.decode(targets, skip_special_tokens=False)


def test_a_chat_rendered_demonstration_ends_with_the_templates_end_of_turn(qwen2, tmp_path):
    # The sampler stops at either token, but a chat model's own turns end with <|im_end|>:
    # a warm start ending them with EOS teaches the turn an ending the template never writes.
    tok = load_tokenizer(qwen2)
    task = task_for(run_cfg({"path": jsonl(tmp_path / "d.jsonl", ROWS), "sft_key": "solution",
                             "chat_template": True}), tok)
    p = task.train_problems(0, 1, stream="sft")[0]
    sample = demonstration_sample(tok, task, p)
    assert trained_text(tok, sample) == p.row["solution"] + IM_END
    # prompt + trained tokens: the template's own rendering of the turn, up to its end
    turn = tok.apply_chat_template([{"role": "user", "content": p.row["question"]},
                                    {"role": "assistant", "content": p.row["solution"]}],
                                   tokenize=False)
    whole = tok(turn)["input_ids"]
    assert sample.prompt_ids + sample.response_ids == whole[:whole.index(tok.convert_tokens_to_ids(
        IM_END), len(sample.prompt_ids)) + 1]


def test_a_raw_prompts_demonstration_ends_with_eos_and_only_it_is_trained(qwen2, tmp_path):
    tok = load_tokenizer(qwen2)
    task = task_for(run_cfg({"path": jsonl(tmp_path / "d.jsonl", ROWS), "sft_key": "solution"}),
                    tok)
    p = task.train_problems(0, 1, stream="sft")[0]
    assert trained_text(tok, demonstration_sample(tok, task, p)) == p.row["solution"] + EOS


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A <pad> token of its own (qwen2 pads with EOS)."""
    return build_hf_model(tmp_path_factory.mktemp("hf") / "llama", "llama")


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_left_and_right_padding_compute_what_each_sequence_alone_computes(arch, request):
    # Prompts of 3-20 tokens, left-padded; completions of ragged lengths, right-padded;
    # with qwen2 every pad is an EOS id, and completions end with EOS too.
    path = request.getfixturevalue(arch)
    tok, policy = load_tokenizer(path), load_policy(path).eval()
    texts = ["12+34=", "Natalia sold clips to 48 of her friends in April.", "7*8=",
             "How many clips did she sell? Let us think"]
    prompts = [tok(t)["input_ids"] for t in texts]
    outs = TorchRollout.from_pretrained(path).generate(
        prompts, SamplingParams(temperature=1.0, max_new_tokens=10), seed=1)
    outs[1].token_ids = outs[1].token_ids[:4] + [tok.eos_token_id]
    outs[1].logprobs = outs[1].logprobs[:5]
    samples = [Sample(Problem("", ""), p, o.token_ids, o.logprobs, True, 0, 0)
               for p, o in zip(prompts, outs, strict=True)]
    batch = pack(samples, tok.pad_token_id)
    with torch.no_grad():
        padded, _ = response_logprobs(policy, batch, 1.0)
        packed, _ = response_logprobs(policy, batch, 1.0, packed=True)
        for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
            n = len(o.token_ids)
            alone = policy(input_ids=torch.tensor([p + o.token_ids])).logits[0].log_softmax(-1)
            alone = alone[len(p) - 1:-1].gather(-1, torch.tensor(o.token_ids)[:, None])[:, 0]
            assert (padded[i, :n] - alone).abs().max() < 1e-5
            assert (packed[i, :n] - alone).abs().max() < 1e-5
            if i != 1:       # the sampler's own logprobs (row 1 was cut and given an EOS)
                assert (torch.tensor(o.logprobs) - alone).abs().max() < 1e-5


class RecordingEngine:
    """The rollout seam, recording the prompts it is asked to continue; every completion
    is one EOS."""

    def __init__(self, eos: int):
        self.eos, self.prompts = eos, []

    def generate(self, prompts, params, seed, on_complete=None, budgets=None):
        self.prompts += prompts
        return [Completion([self.eos], [0.0], True, 0) for _ in prompts]


def appending_eos(path):
    """The model's tokenizer as a supervised fine-tune often saves it: add_eos_token."""
    tok = load_tokenizer(path)
    tok.add_eos_token = True
    assert tok("12+34=")["input_ids"][-1] == tok.eos_token_id
    return tok


def test_no_prompt_ends_with_the_eos_a_tokenizer_appends(qwen2, tmp_path):
    # A prompt ending in EOS asks the model to go on after the end of the sequence: the
    # warm start would teach answers there, and the sampler would sample them there.
    tok = appending_eos(qwen2)
    task = build_task(ArithmeticTaskConfig(type="arithmetic", eval_size=8))
    p = task.train_problems(0, 1, stream="sft")[0]
    assert demonstration_sample(tok, task, p).prompt_ids == \
        tok(p.prompt, add_special_tokens=False)["input_ids"]
    engine = RecordingEngine(tok.eos_token_id)
    evaluate(engine, task, tok, temperature=1.0, max_new_tokens=4, seed=0)
    assert engine.prompts and all(ids[-1] != tok.eos_token_id for ids in engine.prompts)


def test_a_prompt_keeps_its_bos_and_an_eos_written_in_its_own_text(qwen2):
    from engine.tinymodel import build_tokenizer

    chars = build_tokenizer()                       # prepends <bos>
    assert encode_prompt(chars, "1+1=") == chars("1+1=")["input_ids"]
    assert encode_prompt(chars, "1+1=")[0] == chars.bos_token_id
    tok = appending_eos(qwen2)
    assert encode_prompt(tok, "7*8=" + EOS) == tok("7*8=" + EOS, add_special_tokens=False)[
        "input_ids"]
