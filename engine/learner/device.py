"""Where and in what precision the learner computes: ``[learner]`` turned into torch.

The device is resolved in the process that trains, never when the config is validated:
the web process validates configs for a cluster it is not part of, so only the learner's
own process can tell whether the GPU it was given exists. Under Ray that process sees
exactly the GPUs of its bundle (Ray sets CUDA_VISIBLE_DEVICES), so "cuda" is the first
of them.
"""

from __future__ import annotations

import contextlib
import os

import torch

from engine.config import LearnerConfig


class DeviceUnavailableError(RuntimeError):
    """``learner.device`` names a device this process does not have."""


def resolve_device(choice: str) -> torch.device:
    """"cpu" | "cuda" | "auto" -> the torch device to train on, or a refusal that names
    the field and the fix."""
    if choice == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if choice == "auto":
        return torch.device("cpu")
    why = ("this torch build has no CUDA support" if torch.version.cuda is None
           else "torch sees no CUDA device (CUDA_VISIBLE_DEVICES="
           f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r})")
    raise DeviceUnavailableError(
        f'learner.device = "cuda", but {why} in this process (torch {torch.__version__}); '
        f'set learner.device = "auto" (a GPU where there is one, else the CPU) or "cpu", or '
        f"place the learner where a GPU is assigned to it")


def autocast(device: torch.device, cfg: LearnerConfig) -> contextlib.AbstractContextManager:
    """bf16 autocast of matmuls for precision = "bf16" (parameters, gradients and
    optimizer state keep their own dtype); a no-op for "fp32"."""
    if cfg.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


FUSED_ADAMW_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def adamw(module: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over ``module``'s parameters, fused (one kernel over every parameter per
    step instead of a handful of passes each: the small preset's update 2 % faster on
    CPU, bench/learner_throughput.py) wherever torch has the fused kernel: plain tensors
    on the CPU or CUDA in a floating dtype it covers. FSDP2's sharded parameters
    (DTensors) keep the default for-each form."""
    params = list(module.parameters())
    fused = bool(params) and all(
        type(p.data) is torch.Tensor and p.device.type in ("cpu", "cuda")
        and p.dtype in FUSED_ADAMW_DTYPES for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)


def compile_layers(model: torch.nn.Module) -> None:
    """learner.compile: torch.compile each decoder layer of ``model`` in place (its
    parameters, names and state dict unchanged: checkpoints and weight sync see the same
    model), with dynamic shapes so a new batch shape does not recompile."""
    layers = getattr(model.base_model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ValueError(f"learner.compile = true compiles the model's decoder layers "
                         f"(base_model.layers), and {type(model).__name__} has none there; "
                         f"set learner.compile = false")
    for layer in layers:
        layer.compile(dynamic=True)
