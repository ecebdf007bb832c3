"""Tiny random-weight Hugging Face checkpoints of several architectures, built locally.

    path = build_hf_model(tmp_path / "qwen2", "qwen2")   # config.json, model.safetensors,
                                                         # tokenizer.json, chat template
    ARCHITECTURES                                        # the architectures tests cover

Each directory is what a user brings with ``model.path``: a causal LM saved with
``save_pretrained`` and a byte-level BPE tokenizer trained here on a small corpus (vocab
~300), with a ChatML-style chat template whose end-of-turn token is ``<|im_end|>``.
Nothing is downloaded. Sizes fit vLLM's CPU attention (head_dim 32) and keep a forward
pass to milliseconds: hidden 64, 2 layers, 2 query heads over 1 KV head (GQA).

The variants differ where the engine has to care:

    llama    LlamaForCausalLM, untied lm_head, a <pad> token
    qwen2    Qwen2ForCausalLM, q/k/v biases, tied embeddings, no pad token (falls back
             to EOS), <|im_end|> in generation_config's eos list
    qwen3    Qwen3ForCausalLM, q/k RMS norms, untied
    mistral  MistralForCausalLM, tied embeddings
    gpt_neox GPTNeoXForCausalLM (Pythia's family): fused qkv, LayerNorm with biases,
             parallel attention + MLP residual, rotary on a quarter of each head, no
             grouped KV heads (num_key_value_heads is ignored)

and the Mixture-of-Experts ones (MOE_ARCHITECTURES: 4 experts, top-2 per token, in
every layer), whose routers differ in how they weigh the chosen experts:

    qwen2_moe  Qwen2MoeForCausalLM, a shared expert beside the routed ones, the top-2
               weights left as their share of the softmax (norm_topk_prob = False)
    mixtral    MixtralForCausalLM, the top-2 weights renormalized to sum to 1
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")
MOE_ARCHITECTURES = ("qwen2_moe", "mixtral")

EOS, IM_START, IM_END, PAD = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
    "clips in May. How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of "
    "babysitting. How much did she earn? #### 10",
    "12+34=46 7*8=56 99-100=-1 3+4=7 rev:abcdef=fedcba",
    "The answer is \\boxed{42}. Let us think step by step: first add, then multiply.",
    "def f(x): return x * 2 + 3  # a tiny program",
] * 4

ARCH = {
    "llama": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=False)),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(tie_word_embeddings=False, head_dim=32)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(tie_word_embeddings=True,
                                                        head_dim=32, sliding_window=None)),
    "gpt_neox": (GPTNeoXConfig, GPTNeoXForCausalLM, dict(
        tie_word_embeddings=False, rotary_pct=0.25, use_parallel_residual=True)),
    "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM, dict(
        tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=64, shared_expert_intermediate_size=64, norm_topk_prob=False)),
    "mixtral": (MixtralConfig, MixtralForCausalLM, dict(
        tie_word_embeddings=False, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=None)),
}


def build_bpe_tokenizer(with_pad: bool = True, vocab_size: int = 300,
                        corpus: list[str] = CORPUS) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``corpus``, with ChatML special tokens and a chat
    template."""
    specials = [EOS, IM_START, IM_END] + ([PAD] if with_pad else [])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS,
                                   pad_token=PAD if with_pad else None,
                                   additional_special_tokens=[IM_START, IM_END])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_hf_model(path: Path, arch: str, seed: int = 0, corpus: list[str] = CORPUS,
                   **config_overrides) -> Path:
    """Write a random-weight ``arch`` model and its tokenizer (trained on ``corpus``) to
    ``path``; returns it. ``config_overrides`` change the architecture's config (e.g.
    tie_word_embeddings)."""
    config_cls, model_cls, extra = ARCH[arch]
    extra = {**extra, **config_overrides}
    tok = build_bpe_tokenizer(with_pad=arch != "qwen2", corpus=corpus)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    config = config_cls(**{
        "vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "max_position_embeddings": 512, "bos_token_id": None,
        "eos_token_id": tok.eos_token_id, "pad_token_id": pad, **extra})
    torch.manual_seed(seed)
    model = model_cls(config)
    if arch == "qwen2":
        with torch.no_grad():            # init zeroes biases; make them matter
            for name, p in model.named_parameters():
                if name.endswith("proj.bias"):
                    p.normal_(0.0, 0.5)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    if arch == "qwen2":      # like Qwen2.5-Instruct: end-of-turn is an EOS for generation
        GenerationConfig(eos_token_id=[tok.convert_tokens_to_ids(IM_END), tok.eos_token_id],
                         pad_token_id=pad).save_pretrained(path)
    return path


def architecture_of(path: Path) -> str:
    return json.loads((Path(path) / "config.json").read_text())["architectures"][0]
