"""The policy the engine builds itself: a character tokenizer and a small Llama.

Nothing is downloaded. ``ensure_base_model`` writes a HF-format directory (safetensors,
config.json, tokenizer.json) into the local cache, keyed by a hash of everything that
defines it, so the learner, the torch sampler and vLLM all load the same directory (through
engine.model, like a ``model.path`` directory):

    ~/.cache/rlplane/models/tiny-<key>/   config.json  model.safetensors  tokenizer.json ...

Set RLPLANE_CACHE to move the cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()   # load/save bars would drown the run's own progress

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
CHARS = "0123456789+-*=:" + "abcdefghijklmnopqrstuvwxyz" + " "
VOCAB: dict[str, int] = {t: i for i, t in enumerate([PAD, BOS, EOS, UNK, *CHARS])}

# head_dim is 64 in both presets: vLLM's CPU attention accepts only some head sizes.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=512),                                 # ~2.6M params
    "small": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                  intermediate_size=1024),                               # ~21M params
}
FORMAT_VERSION = 1  # bump when the layout of the cached directory changes


def cache_root() -> Path:
    return Path(os.environ.get("RLPLANE_CACHE", Path.home() / ".cache" / "rlplane"))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, <bos> prepended, decode concatenates."""
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, VOCAB[BOS])])
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        padding_side="left")


def llama_config(size: str) -> LlamaConfig:
    p = PRESETS[size]
    return LlamaConfig(
        vocab_size=len(VOCAB), head_dim=64, num_key_value_heads=p["num_attention_heads"],
        max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, bos_token_id=VOCAB[BOS], eos_token_id=VOCAB[EOS],
        pad_token_id=VOCAB[PAD], torch_dtype="float32", **p)


def _key(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def atomic_dir(final: Path, write, once: bool = False) -> Path:
    """Build a directory in a temp sibling and rename it into place (safe under races).
    ``write(tmp)`` may return another path to put it at instead (not a cache entry).
    ``once`` (cache entries): processes that want the entry at the same time build it
    once; the others wait on a lock file beside it, then find it built (a warm start is a
    minute of CPU that two runs, or two test workers, starting together would each pay)."""
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    if not once:
        return _build_dir(final, write)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return final if final.exists() else _build_dir(final, write)


def _build_dir(final: Path, write) -> Path:
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}."))
    try:
        final = write(tmp) or final
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tmp, final)
    except OSError:
        if not final.exists():
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def ensure_base_model(size: str, seed: int) -> Path:
    """Path of the randomly initialized model + tokenizer for (size, seed), built once."""
    cfg = llama_config(size)
    key = _key({"cfg": cfg.to_dict(), "vocab": VOCAB, "seed": seed, "v": FORMAT_VERSION})

    def write(d: Path) -> None:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
        model.save_pretrained(d, safe_serialization=True)
        build_tokenizer().save_pretrained(d)

    return atomic_dir(cache_root() / "models" / f"{size}-{key}", write, once=True)
