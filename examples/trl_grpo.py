"""A TRL GRPO run reported to rlplane: a tiny random Llama built here, on CPU, offline.

    python examples/trl_grpo.py --steps 20                    # a reward that varies
    python examples/trl_grpo.py --steps 20 --constant-reward  # a flat reward: StuckReward
    python examples/trl_grpo.py --steps 500 --reward-delay 0.5  # long enough to stop it

It reports to the run that RLPLANE_URL, RLPLANE_RUN_ID and RLPLANE_TOKEN name (rlplane
sets them when it launches this as a command run): TRL's metrics at every step, each
step's completions, its timing, and how it ended. A stop from rlplane ends it after the
current step; SIGTERM (how Ray stops a job) or Ctrl-C ends it at once, also reported as
stopped. Nothing is downloaded: the tokenizer is trained on a few lines below and the
model has random weights, so the completions are noise and only the reward moves.
Tested with TRL 1.16.0.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from pathlib import Path

from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from rlplane import track
from rlplane.adapters.trl import RlplaneCallback

PROMPTS = ["12+34=", "7*8=", "99-100=", "3+4=", "Add 5 and 6:", "Twice 21 is",
           "The answer is", "def f(x): return"]
EOS, PAD = "<|endoftext|>", "<pad>"


def build_model(path: Path) -> Path:
    """A byte-level BPE tokenizer (vocab ~300) and a random 2-layer Llama, saved to ``path``
    (GRPO loads its reference model from there when beta > 0)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(PROMPTS * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOS, PAD], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class Terminated(BaseException):
    """SIGTERM: how Ray stops a job (SIGKILL follows a few seconds later). A BaseException,
    like KeyboardInterrupt, so no `except Exception` in the libraries swallows it."""


def _terminate(signum, frame):
    raise Terminated("SIGTERM")


def digit_share(completions, **kwargs) -> list[float]:
    """The share of a completion's characters that are digits: varies, so GRPO learns."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def constant(completions, **kwargs) -> list[float]:
    """The same reward for every completion: no group has a spread, nothing is learned."""
    return [1.0] * len(completions)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--constant-reward", action="store_true")
    parser.add_argument("--reward-delay", type=float, default=0.0,
                        help="seconds each reward call sleeps, to make the steps longer")
    parser.add_argument("--output-dir", default=None)
    opts = parser.parse_args(argv)

    scorer = constant if opts.constant_reward else digit_share

    def reward(completions, **kwargs):
        time.sleep(opts.reward_delay)
        return scorer(completions)
    reward.__name__ = scorer.__name__   # TRL names the rewards/<name>/mean metric after it

    out = Path(opts.output_dir or tempfile.mkdtemp(prefix="trl-grpo-"))
    config = GRPOConfig(
        output_dir=str(out / "trainer"), max_steps=opts.steps, per_device_train_batch_size=4,
        num_generations=2, max_completion_length=8, beta=0.04, learning_rate=1e-4,
        logging_steps=1, log_completions=True, num_completions_to_print=0, report_to=[],
        use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, seed=0)
    signal.signal(signal.SIGTERM, _terminate)
    run = track.init()
    try:
        trainer = GRPOTrainer(model=str(build_model(out / "model")), reward_funcs=reward,
                              args=config,
                              train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
        trainer.add_callback(RlplaneCallback(trainer, run=run))
        trainer.train()      # the callback finishes the run: succeeded, or stopped
    except (Terminated, KeyboardInterrupt) as e:
        # told to end from outside: stopped, not the "failed" that rlplane.track's exit
        # hook reports for any other uncaught exception
        run.finish("stopped", f"{type(e).__name__}: the process was told to end")
        raise


if __name__ == "__main__":
    main()
