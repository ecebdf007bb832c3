"""Checkpoints: everything needed to continue a run bit-for-bit.

    <run>/checkpoints/step_000012/
        config.json model.safetensors tokenizer.json ...   HF dir: vLLM / a fork loads it
        optimizer.pt                                       AdamW state
        rng.pt                                             python, numpy, torch RNG states
        state.json                                         step, weight version, fingerprint
                                                           (and its fingerprint_scheme)
        data.json ...                                      the driver's ``files`` (its data
                                                           ledger: engine.orchestration.ledger)
        critic/ critic_optimizer.pt                        PPO: the value model and its AdamW

A checkpoint counts once it is complete, and a kill (SIGKILL, OOM, a lost node) at any
instant leaves the latest complete one for a resume to take:

    .step_000012.<tmp>/   written in full, the driver's files too   (hidden: never read)
    step_000012/          renamed into place: complete as it appears
    step_000012.replaced/ the step's previous save, moved aside while the step is saved
                          again (the run's last checkpoint after that step's periodic
                          one); read when step_000012/ is not there yet

Only names of that shape are checkpoints (latest_checkpoint); a directory is removed by
renaming it to a hidden name first, so a kill in the middle of removing one leaves nothing
that reads as a checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from engine.learner.ppo import PpoLearner, move_critic_state
from engine.model import load_tokenizer
from engine.weightsync.fingerprint import FINGERPRINT_SCHEME, stream_fingerprint

# The names a checkpoint goes by (module docstring): step_N, and step_N.replaced.
REPLACED = ".replaced"
CHECKPOINT_DIR = re.compile(rf"step_(\d{{6,12}})({re.escape(REPLACED)})?")


def save_checkpoint(root: Path, learner, model_dir: Path, keep_last: int,
                    critic_state: Path | None = None,
                    files: dict[str, str] | None = None) -> Path:
    """``critic_state``: where a critic on its own bundle saved its state for this step
    (critic/, critic_optimizer.pt), moved into the checkpoint as it is written.
    ``files``: the driver's, by name (data.json), written in before it counts."""
    final = root / f"step_{learner.step:06d}"
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
    try:
        learner.policy.save_pretrained(staging, safe_serialization=True)
        torch.save(learner.optimizer.state_dict(), staging / "optimizer.pt")
        if isinstance(learner, PpoLearner):
            learner.critic.save(staging)
        if critic_state is not None:
            move_critic_state(critic_state, staging)
        write_run_state(staging, learner, model_dir, learner.fingerprint(), files)
        publish(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)     # there only if writing it failed
    prune_checkpoints(root, keep_last)
    return final


def publish(staging: Path, final: Path) -> None:
    """Rename the complete ``staging`` directory to ``final``. A step saved again moves
    its previous save aside (``step_N.replaced``, which latest_checkpoint reads while
    ``step_N`` is missing) rather than deleting it first, so at every instant a complete
    checkpoint of the step is there to resume from, even with keep_last = 1."""
    aside = final.with_name(final.name + REPLACED)
    if final.exists():
        discard(aside)                 # an older aside a kill left: final supersedes it
        os.rename(final, aside)
    os.rename(staging, final)
    discard(aside)


def discard(d: Path) -> None:
    """Remove ``d``: renamed to a hidden name first, so a kill while its files are being
    deleted leaves nothing that reads as a checkpoint (prune_checkpoints sweeps it)."""
    if not d.exists():
        return
    trash = d.with_name(f".{d.name}.trash")
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(d, trash)
    shutil.rmtree(trash, ignore_errors=True)


def write_run_state(d: Path, learner, model_dir: Path, fp: str,
                    files: dict[str, str] | None = None) -> None:
    """What every checkpoint holds besides weights and optimizer: the tokenizer, the RNG
    states, step / weight version / fingerprint, and the driver's ``files``."""
    for name, text in (files or {}).items():
        (d / name).write_text(text)
    load_tokenizer(model_dir).save_pretrained(d)
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    # Plain lists and numbers only, so a resume loads it with weights_only=True.
    torch.save({"python": random.getstate(),
                "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
                "torch": torch.get_rng_state()}, d / "rng.pt")
    (d / "state.json").write_text(json.dumps({
        "step": learner.step, "version": learner.version, "fingerprint": fp,
        "fingerprint_scheme": FINGERPRINT_SCHEME}))


def checkpoint_dirs(root: Path) -> list[Path]:
    """The directories under ``root`` named as checkpoints, oldest first (a step's
    ``.replaced`` save just before the step's own), complete or not."""
    found = []
    for p in root.glob("step_*"):
        if (m := CHECKPOINT_DIR.fullmatch(p.name)) and p.is_dir():
            found.append(((int(m[1]), m[2] is None), p))
    return [p for _, p in sorted(found)]


def complete_checkpoints(root: Path) -> list[Path]:
    """The checkpoints a resume may take, oldest first: those with state.json (every one
    this engine renamed into place), a step's ``.replaced`` save only while the step's own
    is missing."""
    done = [p for p in checkpoint_dirs(root) if (p / "state.json").exists()]
    names = {p.name for p in done}
    return [p for p in done if p.name.removesuffix(REPLACED) == p.name
            or p.name.removesuffix(REPLACED) not in names]


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def prune_checkpoints(root: Path, keep_last: int) -> None:
    """Keep the last ``keep_last`` complete checkpoints; remove the rest and sweep what
    killed saves and removals left (hidden ``.step_*``, and ``.critic_step_*``, the state
    a critic on its own bundle saved for a save that was killed before moving it in: the
    run's one saver is past its own by now)."""
    keep = complete_checkpoints(root)[-keep_last:]
    for old in checkpoint_dirs(root):
        if old not in keep:
            discard(old)
    for left in (*root.glob(".step_*"), *root.glob(".critic_step_*")):
        shutil.rmtree(left, ignore_errors=True)


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
    scheme = state.get("fingerprint_scheme")
    if scheme not in (None, FINGERPRINT_SCHEME):
        raise RuntimeError(f"checkpoint {path} records a fingerprint of scheme {scheme}, which "
                           f"this rlplane does not know (it computes scheme "
                           f"{FINGERPRINT_SCHEME}); resume it with the rlplane that wrote it")
    if learner.fingerprint() != state["fingerprint"] and not (
            scheme is None                          # written before per-tensor digests
            and stream_fingerprint(learner.named_tensors()) == state["fingerprint"]):
        raise RuntimeError(f"checkpoint {path} weights do not match their recorded fingerprint")
    return state
