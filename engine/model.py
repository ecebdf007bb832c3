"""The policy model of a run: which directory it is and how every part loads it.

    base_model_dir(cfg.model)     model.path as given, or the Llama the engine builds
                                  itself (engine.tinymodel, cached by size and seed)
    ensure_warm_start(cfg)        (engine.learner.warmstart) THE model directory of the
                                  run: the base after the supervised warm start, if any
    load_policy(dir, dtype)       AutoModelForCausalLM, SDPA attention
    load_critic(dir, dtype)       PPO's value model: AutoModelForTokenClassification with
                                  one label (the architecture's base model + a scalar head)
    load_tokenizer(dir)           AutoTokenizer, left padding, pad token -> EOS if unset
    encode_prompt(tok, text)      the ids a prompt is generated from (no appended EOS)
    eos_token_ids(dir)            config.json + generation_config.json EOS ids
    stop_token_ids(tok, dir)      those + the chat template's end-of-turn token

The learner, the reference model, the torch sampler and vLLM all load the directory the
loop hands them through these functions, so a checkpoint, a warm start and a user's
Hugging Face directory are one case. Nothing here downloads: a path that is not a local
directory fails (engine.config validates it first and names the missing file).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer
from transformers.utils import logging as hf_logging

from engine.config import ModelConfig

hf_logging.disable_progress_bar()   # load/save bars would drown the run's own progress

# An assistant turn with this content shows where the template closes a turn.
_PROBE = "rlplane-end-of-turn-probe"


def base_model_dir(model: ModelConfig) -> Path:
    """The directory the run starts from, before any warm start."""
    if model.path is not None:
        return Path(model.path).expanduser()
    from engine.tinymodel import ensure_base_model

    return ensure_base_model(model.size, model.seed)


def load_policy(path: Path, dtype: torch.dtype = torch.float32,
                trust_remote_code: bool = False) -> torch.nn.Module:
    """A causal LM from ``path`` (a model.path directory, a warm start or a checkpoint).
    Tied input/output embeddings stay one parameter: named_parameters() lists it once,
    under the input embedding's name, and so does every fingerprint of it."""
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="sdpa", trust_remote_code=trust_remote_code,
        local_files_only=True)


def load_critic(path: Path, dtype: torch.dtype = torch.float32,
                trust_remote_code: bool = False) -> torch.nn.Module:
    """A value model from ``path``: a causal LM's directory (the policy: its base model's
    weights, a new head) or a saved critic (its head too), as veRL and OpenRLHF build
    theirs. A new head starts at zero, so every first value is 0 and the first advantages
    are the plain returns."""
    # From a causal LM the load report lists lm_head as unused and the head as new: both
    # expected here, and the report would read like a fault in the run's log.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        critic, info = AutoModelForTokenClassification.from_pretrained(
            path, num_labels=1, dtype=dtype, attn_implementation="sdpa",
            trust_remote_code=trust_remote_code, local_files_only=True,
            output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    with torch.no_grad():
        if any(k.startswith("score.") for k in info["missing_keys"]):
            for p in critic.score.parameters():
                p.zero_()
        # Own, freshly allocated storage: tensors loaded from a file sit at offsets its
        # layout decides, and kernels round differently by alignment, so a critic resumed
        # from a checkpoint computed values 1e-8 off the one that wrote it.
        for p in critic.parameters():
            p.data = p.data.clone()
    return critic


def load_tokenizer(path: Path, trust_remote_code: bool = False):
    """The tokenizer saved with the model, set up for batched generation: prompts are
    left-padded (the layout of the sampler and the learner's packing), and a tokenizer
    without a pad token pads with EOS (pad positions are masked everywhere)."""
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code,
                                        local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"the tokenizer in {path} has neither a pad nor an EOS token; "
                             "set eos_token in its tokenizer_config.json")
        tok.pad_token = tok.eos_token
    return tok


def encode_prompt(tokenizer, text: str) -> list[int]:
    """The ids every part generates from, trains on and counts for ``text`` as a prompt:
    the tokenizer's own encoding (its BOS included), less an EOS its post-processor
    appends (add_eos_token, as tokenizers saved from supervised fine-tuning often have
    it): a prompt ending in EOS asks the model to go on after the end of the sequence."""
    ids = tokenizer(text)["input_ids"]
    if len(ids) > 1 and ids[-1] == tokenizer.eos_token_id:
        # appended: the text's own tokens come right before it (an EOS the text writes
        # itself is among them)
        own = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > len(own) and ids[len(ids) - 1 - len(own):-1] == own:
            ids = ids[:-1]
    return ids


def chat_prompt(tokenizer, messages: list[dict]) -> str:
    """``messages`` as the chat template renders them for the assistant's next turn (its
    generation prompt), less a BOS the template writes itself when the tokenizer adds one
    anyway (encode_prompt would give it a second)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]:
        text = text[len(bos):]
    return text


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


def eos_token_ids(path: Path) -> tuple[int, ...]:
    """Every id the checkpoint declares as end of sequence: config.json's eos_token_id
    and generation_config.json's (instruct models list their end-of-turn token there,
    as vLLM honours)."""
    ids: list[int] = []
    for name in ("config.json", "generation_config.json"):
        f = Path(path) / name
        if f.exists():
            data = json.loads(f.read_text())
            text = data.get("text_config", data)     # multimodal configs nest the LM's
            ids += _ids(text.get("eos_token_id"))
    return tuple(sorted(set(ids)))


def end_of_turn_token_id(tokenizer) -> int | None:
    """The special token the chat template closes an assistant turn with (<|im_end|>,
    <|eot_id|>, <end_of_turn>, ...), found by rendering one turn; None without a
    template or when the template puts no special token right after the content."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    turn = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": _PROBE}]
    try:
        text = tokenizer.apply_chat_template(turn, tokenize=False)
    except Exception:   # noqa: BLE001 - a template that cannot render a plain turn has none to find
        return None
    at = text.rfind(_PROBE)
    if at < 0:
        return None
    after = tokenizer(text[at + len(_PROBE):], add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids) | {
        i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return after[0] if after and after[0] in special else None


def stop_token_ids(tokenizer, path: Path | None = None) -> tuple[int, ...]:
    """The ids generation stops at: the tokenizer's EOS, the checkpoint's EOS ids and the
    chat template's end-of-turn token. The rollout backends stop at these (the stop token
    is kept in the completion, which counts as finished, not truncated)."""
    ids = set(_ids(tokenizer.eos_token_id))
    if path is not None:
        ids.update(eos_token_ids(path))
    eot = end_of_turn_token_id(tokenizer)
    if eot is not None:
        ids.add(eot)
    return tuple(sorted(ids))
