"""Rollout engines behind one seam (engine.rollout.base.RolloutEngine).

    engine = build_rollout(cfg.rollout, model_dir, cfg.model.dtype, seed)

Backends load lazily by name, so a torch-backend run never imports vLLM.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.config import TorchRolloutConfig, VllmRolloutConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_rollout(cfg: TorchRolloutConfig | VllmRolloutConfig, model_dir: Path, dtype: str,
                  seed: int, weight_transfer: str | None = None,
                  trust_remote_code: bool = False):
    """``weight_transfer``: the backend of weight_sync.type = "vllm_native" (vLLM only)."""
    if isinstance(cfg, VllmRolloutConfig):
        from engine.rollout.vllm_backend import VllmRollout

        return VllmRollout(model_dir, cfg, dtype, seed, weight_transfer, trust_remote_code)
    from engine.rollout.torch_backend import TorchRollout

    return TorchRollout.from_pretrained(model_dir, DTYPES[dtype], trust_remote_code,
                                        record_routing=cfg.record_routing,
                                        prefix_cache_mb=cfg.prefix_cache_mb)
