"""Checkpoints: everything needed to continue a run bit-for-bit.

    <run>/checkpoints/step_000012/
        config.json model.safetensors tokenizer.json ...   HF dir: vLLM / a fork loads it
        optimizer.pt                                       AdamW state
        rng.pt                                             python, numpy, torch RNG states
        state.json                                         step, weight version, fingerprint
        critic/ critic_optimizer.pt                        PPO: the value model and its AdamW

A directory is written under a temp name and renamed, so a crash never leaves a half
checkpoint that looks complete.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from engine.learner.ppo import PpoLearner, move_critic_state
from engine.model import load_tokenizer
from engine.tinymodel import atomic_dir


def save_checkpoint(root: Path, learner, model_dir: Path, keep_last: int,
                    critic_state: Path | None = None) -> Path:
    """``critic_state``: where a critic on its own bundle saved its state for this step
    (critic/, critic_optimizer.pt), moved into the checkpoint as it is written."""
    final = root / f"step_{learner.step:06d}"
    if final.exists():
        shutil.rmtree(final)

    def write(d: Path) -> None:
        learner.policy.save_pretrained(d, safe_serialization=True)
        torch.save(learner.optimizer.state_dict(), d / "optimizer.pt")
        if isinstance(learner, PpoLearner):
            learner.critic.save(d)
        if critic_state is not None:
            move_critic_state(critic_state, d)
        write_run_state(d, learner, model_dir, learner.fingerprint())

    atomic_dir(final, write)
    prune_checkpoints(root, keep_last)
    return final


def write_run_state(d: Path, learner, model_dir: Path, fp: str) -> None:
    """What every checkpoint holds besides weights and optimizer: the tokenizer, the RNG
    states, and step / weight version / fingerprint."""
    load_tokenizer(model_dir).save_pretrained(d)
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    # Plain lists and numbers only, so a resume loads it with weights_only=True.
    torch.save({"python": random.getstate(),
                "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
                "torch": torch.get_rng_state()}, d / "rng.pt")
    (d / "state.json").write_text(json.dumps({
        "step": learner.step, "version": learner.version, "fingerprint": fp}))


def prune_checkpoints(root: Path, keep_last: int) -> None:
    for old in sorted(root.glob("step_*"))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(root: Path) -> Path | None:
    done = sorted(p for p in root.glob("step_*") if (p / "state.json").exists())
    return done[-1] if done else None


def restore_checkpoint(path: Path, learner) -> dict:
    """Load optimizer, counters and RNG into ``learner`` (whose policy was already loaded
    from ``path``). Returns state.json."""
    # AdamW state goes where the parameters are now, not where it was saved from.
    learner.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True,
                                                 map_location=learner.device))
    if isinstance(learner, PpoLearner):          # its weights came from critic_source
        learner.critic.restore_optimizer(path)
    return read_run_state(path, learner)


def read_run_state(path: Path, learner) -> dict:
    """Counters and RNG back into ``learner``; its weights must match the fingerprint."""
    state = json.loads((path / "state.json").read_text())
    rng = torch.load(path / "rng.pt", weights_only=True)
    random.setstate(rng["python"])
    kind, keys, pos, has_gauss, gauss = rng["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(rng["torch"])
    learner.step, learner.version = state["step"], state["version"]
    if learner.fingerprint() != state["fingerprint"]:
        raise RuntimeError(f"checkpoint {path} weights do not match their recorded fingerprint")
    return state
