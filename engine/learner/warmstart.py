"""Supervised warm start on the task's own examples, cached like the base model.

RL from a random init never sees a reward; RL from a converged model has nothing to
learn. A short SFT (bounded by steps and by wall time) lands the policy in between:

    base model (random init) --SFT, answer tokens only--> warm start dir --> RL step 0

The cache key covers the base model, the task and the warm-start settings (not the time
bound), so the demo and the tests pay for it once per machine. A warm start cut short by
its time bound is not cached under that key (it is not what the key promises): the run
uses its own copy in warmstart/partial/, and the next run tries the full one again.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import torch

from engine.config import RunConfig
from engine.experience import Sample
from engine.learner.batch import pack, response_logprobs
from engine.tasks import task_for
from engine.tinymodel import (
    _key,
    atomic_dir,
    cache_root,
    ensure_base_model,
    load_policy,
    load_tokenizer,
)


def encode(tokenizer, problem_prompt: str) -> list[int]:
    return tokenizer(problem_prompt)["input_ids"]


def ensure_warm_start(cfg: RunConfig, log=print) -> Path:
    base = ensure_base_model(cfg.model.size, cfg.model.seed)
    ws = cfg.warm_start
    if ws.steps == 0:
        return base
    tok = load_tokenizer(base)
    task = task_for(cfg, tok)
    key = _key({"base": base.name, "task": cfg.task.model_dump(mode="json"),
                **task.identity(), "ws": ws.model_dump(mode="json", exclude={"max_seconds"}),
                "v": 1})
    final = cache_root() / "warmstart" / f"{base.name}-{key}"
    if final.exists():
        return final

    def write(d: Path) -> int:
        torch.manual_seed(cfg.model.seed)
        model = load_policy(base).train()
        opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.0)
        # Linear warmup, then constant: a short warm start is still learning at its end,
        # and decaying to zero would only waste its last steps.
        warmup = max(1, ws.steps // 20)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
        t0, done, loss = time.monotonic(), 0, float("nan")
        for step in range(ws.steps):
            samples = [Sample(problem=p, prompt_ids=encode(tok, p.prompt),
                              response_ids=tok(task.demonstration(p),
                                               add_special_tokens=False)["input_ids"]
                              + [tok.eos_token_id],
                              behaviour_logprobs=[], finished=True, version=0, group=0)
                       for p in task.train_problems(step, ws.batch_size, stream="sft")]
            for s in samples:
                s.behaviour_logprobs = [0.0] * len(s.response_ids)
            batch = pack(samples, tok.pad_token_id)
            logp, _ = response_logprobs(model, batch, temperature=1.0)
            loss = -(logp * batch.response_mask).sum() / batch.response_mask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            done = step + 1
            if time.monotonic() - t0 > ws.max_seconds:
                log(f"warm start hit its {ws.max_seconds:.0f}s bound after {done} steps")
                break
        model.save_pretrained(d, safe_serialization=True)
        tok.save_pretrained(d)
        (d / "warmstart.json").write_text(json.dumps({
            "steps_done": done, "final_loss": float(loss.detach()),
            "seconds": round(time.monotonic() - t0, 1)}))
        if done < ws.steps:
            log(f"warm start cut short by warm_start.max_seconds: not cached; this run "
                f"starts from it, the next one tries the full {ws.steps} steps again")
        return done

    log(f"warm start: {ws.steps} supervised steps (cached afterwards)")
    return atomic_dir(final, lambda d: None if write(d) == ws.steps else cut_short(final))


def cut_short(final: Path) -> Path:
    """Where a warm start cut short by its time bound goes instead of the cache: a
    directory of this run's own (another run cut short with the same key may be using
    its own), never reused."""
    return final.parent / "partial" / f"{final.name}.{uuid.uuid4().hex[:12]}"
