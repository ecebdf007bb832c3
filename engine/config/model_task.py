"""Config sections of what is trained: the model, the task and the warm start (the RL
algorithm is engine.config.algorithm)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, model_validator

from engine.config._base import FieldError, _choice, _Section
from engine.config.env import EnvTaskConfig

# --------------------------------------------------------------------------- model

ModelSize = Literal["tiny", "small"]


class ModelConfig(_Section):
    """The policy: the Llama the engine builds itself (``size``) or a local Hugging Face
    directory (``path``), exactly one of the two; neither means size = "tiny"."""

    size: ModelSize | None = None
    """Preset of the Llama-architecture policy the engine builds itself, with a character
    tokenizer: "tiny" (~2.7M params) or "small" (~20M params). Both use head_dim 64, which
    vLLM's CPU attention accepts. Leave unset when ``path`` is set."""
    path: str | None = Field(default=None, min_length=1, max_length=4096)
    """A local Hugging Face causal-LM directory (config.json naming a ...ForCausalLM
    architecture, *.safetensors or pytorch_model*.bin weights, tokenizer files, and its
    chat template), loaded by the learner, the reference model, the torch sampler and
    vLLM alike. Nothing is downloaded at run time: the directory must exist at this same
    path on the machine that validates the config AND on every Ray worker node that runs
    a learner or rollout worker (a shared filesystem, or a copy on each node, e.g.
    ``huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir /models/qwen``). A
    path model starts RL from its own weights: the synthetic warm start is skipped unless
    warm_start.steps is set."""
    trust_remote_code: bool = False
    """Let transformers and vLLM run the Python modelling code shipped inside ``path``
    (architectures transformers does not know). Only for directories you trust."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of learner and rollout. float32 keeps logprobs exact on CPU."""
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    """Seed for weight init, data order, sampling and warm start."""

    @model_validator(mode="before")
    @classmethod
    def _size_or_path(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        size, path = data.get("size"), data.get("path")
        if size is not None and path is not None:
            raise FieldError("model.path",
                             f"set model.size or model.path, not both (got size "
                             f"{size!r} and path {path!r}); remove model.size to train the "
                             f"directory, or model.path to use the built-in model")
        if size is None and path is None:
            return {**data, "size": "tiny"}
        return data

    @model_validator(mode="after")
    def _path_holds_a_causal_lm(self, info: ValidationInfo) -> ModelConfig:
        if self.path is None or not (info.context or {}).get("check_files", True):
            return self
        problem = model_dir_problem(Path(self.path).expanduser())
        if problem is not None:
            raise FieldError("model.path", problem)
        return self


def _text_config(path: Path) -> dict:
    """The language model's part of the directory's config.json; {} when the file is
    unreadable (model_dir_problem reports that)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    text = config.get("text_config", config) if isinstance(config, dict) else {}
    return text if isinstance(text, dict) else {}


def max_positions(path: Path) -> int | None:
    """The longest sequence the directory's config.json allows (max_position_embeddings),
    or None when it does not say."""
    value = _text_config(path).get("max_position_embeddings")
    return value if isinstance(value, int) else None


MOE_ROUTERS = {
    "mixtral": "MixtralTopKRouter",
    "qwen2_moe": "Qwen2MoeTopKRouter",
    "qwen3_moe": "Qwen3MoeTopKRouter",
    "olmoe": "OlmoeTopKRouter",
}
"""Mixture-of-Experts families whose routing the engine records and replays (engine.moe):
config.json model_type -> its transformers router class."""


def routing_problem(path: Path) -> str | None:
    """Why model.path's routing cannot be recorded or replayed (a dense model, or an MoE
    family engine.moe does not handle); None for a supported MoE model."""
    text = _text_config(path)
    kind = text.get("model_type")
    if kind in MOE_ROUTERS:
        return None
    if any(k in text for k in ("num_experts", "num_local_experts", "n_routed_experts")):
        return (f"model.path is a Mixture-of-Experts model of type {kind!r}, whose router "
                f"the engine cannot record or replay (it can: {', '.join(MOE_ROUTERS)})")
    return (f"model.path is a dense model (model_type {kind!r}): it has no experts to "
            f"route")


_WEIGHTS = ("*.safetensors", "pytorch_model*.bin")
_VOCAB_FILES = ("vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
                "sentencepiece.bpe.model", "tiktoken.model")


def model_dir_problem(path: Path) -> str | None:
    """What keeps ``path`` from being a loadable causal-LM directory, naming the missing
    file and the fix; None when config, weights and tokenizer are all there. Reads only
    config.json and the file names (no torch, no transformers)."""
    fix_copy = ("download the full model repository to it (huggingface-cli download "
                f"<repo> --local-dir {path}) or save model and tokenizer there with "
                "save_pretrained")
    if not path.exists():
        return (f"{path} does not exist; point model.path at a local Hugging Face model "
                f"directory (it must exist on every Ray worker too), or {fix_copy}")
    if not path.is_dir():
        return f"{path} is a file; model.path names the directory that holds config.json"
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        return f"{path} has no config.json, so it is not a Hugging Face model directory; " \
               f"{fix_copy}"
    try:
        config = json.loads(cfg_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{cfg_file} is not readable JSON ({exc}); restore it from the model repository"
    archs = config.get("architectures") if isinstance(config, dict) else None
    if not archs or not isinstance(archs, list):
        return (f"{cfg_file} names no architectures, so it cannot tell which model class "
                f"to load; add \"architectures\": [\"<Name>ForCausalLM\"] as in the model "
                f"repository")
    if not any(isinstance(a, str) and a.endswith("ForCausalLM") for a in archs):
        return (f"{cfg_file} names architectures {archs}, not a causal LM (...ForCausalLM); "
                f"RL here trains decoder-only causal LMs: use the checkpoint of the causal "
                f"LM (for an encoder or a reward/classification head there is nothing to "
                f"sample from)")
    if not any(next(path.glob(g), None) for g in _WEIGHTS):
        return (f"{path} holds no weights (model.safetensors, model-0000x-of-0000y"
                f".safetensors or pytorch_model*.bin); download the weight files too "
                f"(huggingface-cli download <repo> --local-dir {path})")
    if not (path / "tokenizer.json").is_file():
        if not (path / "tokenizer_config.json").is_file():
            return (f"{path} holds no tokenizer (tokenizer.json or tokenizer_config.json); "
                    f"save it next to the weights with tokenizer.save_pretrained({str(path)!r})")
        if not any((path / f).is_file() for f in _VOCAB_FILES):
            return (f"{path} has tokenizer_config.json but no vocabulary (tokenizer.json, "
                    f"vocab.json + merges.txt or tokenizer.model); copy the tokenizer files "
                    f"from the model repository or save it with tokenizer.save_pretrained")
    return None


# --------------------------------------------------------------------------- task

class ArithmeticTaskConfig(_Section):
    type: Literal["arithmetic"] = "arithmetic"
    seed: int = Field(default=1234, ge=0, le=2**31 - 1)
    """Seed of the problem draws: the train stream and the held-out eval split."""
    ops: list[Literal["+", "-", "*"]] = Field(default=["+", "-", "*"], min_length=1)
    """Operators to draw problems from."""
    min_digits: int = Field(default=1, ge=1, le=3)
    """Fewest digits of an operand."""
    max_digits: int = Field(default=3, ge=1, le=3)
    """Most digits of an operand."""
    eval_size: int = Field(default=256, ge=8, le=4096)
    """Held-out eval problems, drawn from the task seed and never used for training."""
    format_penalty: float = Field(default=0.1, ge=0.0, le=1.0)
    """Subtracted (reward = -format_penalty) when the completion is not a well-formed
    integer terminated by EOS within the token budget."""

    @model_validator(mode="after")
    def _digits_ordered(self) -> ArithmeticTaskConfig:
        if self.min_digits > self.max_digits:
            raise ValueError(f"min_digits ({self.min_digits}) must be <= max_digits "
                             f"({self.max_digits}); lower min_digits or raise max_digits")
        return self


class LongTailTaskConfig(_Section):
    """Reverse a string whose length is heavy-tailed, so completion lengths are too."""

    type: Literal["reverse"] = "reverse"
    seed: int = Field(default=1234, ge=0, le=2**31 - 1)
    """Seed of the problem draws: the train stream and the held-out eval split."""
    min_len: int = Field(default=1, ge=1, le=8)
    """Shortest string to reverse."""
    max_len: int = Field(default=48, ge=2, le=200)
    """Longest string to reverse (the tail is cut here)."""
    tail_alpha: float = Field(default=1.2, gt=0.1, le=4.0)
    """Zipf exponent of the length law P(L) ~ L^-alpha; lower is heavier-tailed."""
    alphabet: str = Field(default="abcdefghij", min_length=2, max_length=26, pattern="^[a-z]+$")
    """Lowercase letters the strings are drawn from."""
    eval_size: int = Field(default=256, ge=8, le=4096)
    """Held-out eval problems, drawn from the task seed and never used for training."""
    format_penalty: float = Field(default=0.1, ge=0.0, le=1.0)
    """Subtracted when the completion does not end with EOS within the token budget."""

    @model_validator(mode="after")
    def _lengths_ordered(self) -> LongTailTaskConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must be <= max_len ({self.max_len})")
        return self


class CodeTaskConfig(_Section):
    """Write a tiny Python program from a spec, scored by running it against unit tests:
    ``mul2add3=`` -> ``f=lambda x:x*2+3`` (any program whose f passes the tests scores)."""

    type: Literal["code"] = "code"
    seed: int = Field(default=1234, ge=0, le=2**31 - 1)
    """Seed of the problem draws: the train stream and the held-out eval split."""
    ops: list[Literal["add", "sub", "mul"]] = Field(default=["add", "sub", "mul"],
                                                    min_length=1)
    """Operations a spec chains onto x, each with a constant (Python precedence applies)."""
    max_terms: int = Field(default=2, ge=1, le=3)
    """Most operations in one spec."""
    max_const: int = Field(default=9, ge=1, le=99)
    """Largest constant of an operation (constants are 1..max_const)."""
    tests: int = Field(default=4, ge=1, le=16)
    """Unit tests per problem: inputs drawn from the problem, expected values computed."""
    eval_size: int = Field(default=64, ge=8, le=4096)
    """Held-out eval problems, drawn from the task seed and never used for training."""
    format_penalty: float = Field(default=0.1, ge=0.0, le=1.0)
    """Subtracted when the program does not run (crash, timeout, limit) or did not end
    with EOS within the token budget."""


class DatasetTaskConfig(_Section):
    """Your own data: prompts and answers read from a local file with the ``datasets``
    library (nothing is downloaded). Checked here (the file, its columns, its rows) and
    again when the engine loads it, with the same messages."""

    type: Literal["dataset"] = "dataset"
    path: str = Field(min_length=1, max_length=1000)
    """Training data: a .jsonl, .json or .parquet file, or a directory written by
    ``Dataset.save_to_disk``. A relative path is read from the working directory, else
    from the rlplane checkout. It must exist where the run's workers run."""
    prompt_key: str = Field(default="prompt", min_length=1, max_length=200)
    """Column of the prompt: text, or a list of chat messages ({role, content}, veRL's
    layout). Dotted for nested columns."""
    answer_key: str = Field(default="answer", min_length=1, max_length=200)
    """Column of the reference answer the reward compares with (dotted for nested columns,
    e.g. ``reward_model.ground_truth``). Numbers are read as their text."""
    sft_key: str | None = Field(default=None, min_length=1, max_length=200)
    """Column the supervised warm start imitates (a worked solution in the model's own
    alphabet); None imitates the answer column."""
    eval_path: str | None = Field(default=None, min_length=1, max_length=1000)
    """Held-out data in a file of its own (same formats and columns). Training drops any
    row whose prompt is also a held-out prompt."""
    eval_fraction: float | None = Field(default=None, gt=0.0, lt=1.0)
    """Without eval_path: the share of distinct prompts held out (None: 0.1), chosen by a
    hash of the prompt text (the same split for every seed and every row order)."""
    eval_size: int = Field(default=256, ge=1, le=100_000)
    """Most held-out prompts an eval scores (the first of the split, in a fixed order)."""
    chat_template: bool = False
    """Render each prompt with the tokenizer's chat template (as a user message, after the
    system prompt); False feeds the prompt text as it is."""
    system_prompt: str | None = Field(default=None, max_length=20_000)
    """System message put before each prompt when chat_template is on (unless the prompt's
    messages start with their own)."""
    max_prompt_tokens: int = Field(default=1024, ge=1, le=1_048_576)
    """Prompts longer than this many tokens (after rendering) are dropped; the run's log
    says how many."""
    format_penalty: float = Field(default=0.1, ge=0.0, le=1.0)
    """Subtracted when the completion did not end with EOS within the token budget or no
    answer can be read from it."""

    @model_validator(mode="after")
    def _data_readable(self, info: ValidationInfo) -> DatasetTaskConfig:
        from engine.config.datafile import CONFIG_PROBE_ROWS, DataFileError, probe

        if self.eval_path is not None and self.eval_fraction is not None:
            raise FieldError("task.eval_fraction",
                             "holds out part of task.path, and task."
                             "eval_path names held-out data of its own; set only one")
        if self.system_prompt is not None and not self.chat_template:
            raise FieldError("task.system_prompt",
                             "is only sent through a chat template; set "
                             "task.chat_template = true or remove system_prompt")
        if not (info.context or {}).get("check_files", True):
            return self      # the files are where the run's workers run (the server checks)
        try:
            for field, raw in (("task.path", self.path), ("task.eval_path", self.eval_path)):
                if raw is not None:
                    probe(field, raw, self.columns(), CONFIG_PROBE_ROWS)
        except DataFileError as exc:
            raise FieldError(exc.field, str(exc)) from None
        return self

    def held_out_fraction(self) -> float:
        return 0.1 if self.eval_fraction is None else self.eval_fraction

    def columns(self) -> dict[str, str]:
        """Each key field and the dotted column it names."""
        keys = {"task.prompt_key": self.prompt_key, "task.answer_key": self.answer_key}
        if self.sft_key is not None:
            keys["task.sft_key"] = self.sft_key
        return keys


TaskConfig = _choice(ArithmeticTaskConfig, LongTailTaskConfig, CodeTaskConfig, DatasetTaskConfig,
                     EnvTaskConfig)


# --------------------------------------------------------------------------- warm start

class WarmStartConfig(_Section):
    steps: int | None = Field(default=None, ge=0, le=20_000)
    """Supervised steps on the task's own examples before RL (0 = start from the model as
    it is). Unset: 300 for the built-in model (RL from a random init never sees a reward),
    0 for a model.path checkpoint (it starts RL from its own weights)."""
    batch_size: int = Field(default=64, ge=1, le=1024)
    """Examples per supervised step."""
    lr: float = Field(default=1e-3, gt=0.0, le=1.0)
    """AdamW learning rate of the warm start (linear warmup over 5% of steps, then flat)."""
    max_seconds: float = Field(default=600.0, gt=0.0, le=3600.0)
    """Safety bound on wall time. ``steps`` defines the result (and the cache key): a warm
    start cut short by this bound depends on machine load, so keep it well above the
    expected time (300 tiny steps take ~50 s on 2 idle cores)."""
