"""The model directory of a run: its base model after an optional supervised warm start
on the task's own examples, cached like the base model.

RL from a random init never sees a reward; RL from a converged model has nothing to
learn. A short SFT (bounded by steps and by wall time) lands the policy in between:

    base model (built-in random init, or model.path)
        --SFT, answer tokens only--> warm start dir --> RL step 0

A model.path checkpoint skips it unless warm_start.steps is set (RunConfig.
warm_start_steps): its directory is the run's model directory as it is, loaded in place.

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
from engine.learner.batch import PackedBatch, pack, packed_layout, response_logprobs
from engine.model import (
    base_model_dir,
    encode_prompt,
    end_of_turn_token_id,
    load_policy,
    load_tokenizer,
)
from engine.rollout.turns import TurnTemplate
from engine.tasks import Problem, Task, task_for
from engine.tasks.env import EnvTask
from engine.tinymodel import _key, atomic_dir, cache_root


def demonstration_end(tok, task: Task) -> int:
    """The token a demonstration ends with: after a chat-rendered prompt, the one the
    template closes an assistant turn with (<|im_end|>, <end_of_turn>, <|end|>: what the
    model's own turns end with, and a stop id of the sampler), else EOS."""
    eot = end_of_turn_token_id(tok) if task.chat else None
    return tok.eos_token_id if eot is None else eot


def demonstration_sample(tok, task: Task, problem: Problem) -> Sample:
    """One supervised example: the prompt as the sampler sees it, then the task's
    demonstration and the token that ends it (demonstration_end), which are all the loss
    is taken over (the prompt is context only; so are a multi-turn demonstration's
    observations: its loss mask leaves them out)."""
    if isinstance(task, EnvTask) and (turns := TurnTemplate(tok)).chat:
        return chat_demonstration_sample(tok, turns, task, problem)
    response, mask = [], []
    for text, trained in task.demonstration_turns(problem):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        response += ids
        mask += [int(trained)] * len(ids)
    response, mask = response + [demonstration_end(tok, task)], mask + [1]
    return Sample(problem=problem, prompt_ids=encode_prompt(tok, problem.prompt),
                  response_ids=response, behaviour_logprobs=[0.0] * len(response),
                  finished=True, version=0, group=0,
                  loss_mask=None if all(mask) else mask)


def chat_demonstration_sample(tok, turns: TurnTemplate, task: EnvTask,
                              problem: Problem) -> Sample:
    """A multi-turn demonstration as a trajectory under the chat template reads: the
    opening rendered with it, each assistant message's tokens trained on, what follows
    one (the template's close, the observations, the next generation prompt) read only,
    and the last answer closed by the end-of-turn token the model then learns to write."""
    end = end_of_turn_token_id(tok)
    response, mask = [], []
    messages = task.demonstration_messages(problem)    # the model's turn first
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        ids = tok(m["content"], add_special_tokens=False)["input_ids"]
        rest = messages[i + 1:]
        answers = [j for j, n in enumerate(rest) if n["role"] == "assistant"]
        if answers:
            read = turns.after(ids, rest[:answers[0]])
        else:                                           # the answer
            ids, read = ids + [tok.eos_token_id if end is None else end], []
        response, mask = response + ids + read, mask + [1] * len(ids) + [0] * len(read)
    return Sample(problem=problem, prompt_ids=turns.opening(task.opening(problem)),
                  response_ids=response, behaviour_logprobs=[0.0] * len(response),
                  finished=True, version=0, group=0, loss_mask=mask)


def base_identity(base: Path) -> str:
    """What names a base model in a cache key: a built-in model's directory name is its
    own content hash; a user's directory is its path plus its files' sizes and mtimes."""
    if base.parent == cache_root() / "models":
        return base.name
    files = sorted(f for f in base.iterdir() if f.is_file())
    return _key({"path": str(base.resolve()),
                 "files": [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]})


def ensure_warm_start(cfg: RunConfig, log=print) -> Path:
    """THE model directory of the run (what the learner, the reference model and every
    rollout engine load): the base model, warm-started when the run asks for it."""
    base = base_model_dir(cfg.model)
    ws, steps = cfg.warm_start, cfg.warm_start_steps
    if steps == 0:
        return base
    remote = cfg.model.trust_remote_code
    tok = load_tokenizer(base, remote)
    task = task_for(cfg, tok)
    # The demonstrations' end token is a key part where it is not EOS (a chat task's), so
    # the warm starts that end with EOS keep their keys.
    end = demonstration_end(tok, task)
    key = _key({"base": base_identity(base), "task": cfg.task.model_dump(mode="json"),
                **task.identity(), **({"end": end} if end != tok.eos_token_id else {}),
                "ws": {**ws.model_dump(mode="json", exclude={"max_seconds"}), "steps": steps},
                "v": 2})
    final = cache_root() / "warmstart" / f"{base.name}-{key}"
    if final.exists():
        return final

    def write(d: Path) -> int:
        torch.manual_seed(cfg.model.seed)
        model = load_policy(base, trust_remote_code=remote).train()
        opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.0)
        # Linear warmup, then constant: a short warm start is still learning at its end,
        # and decaying to zero would only waste its last steps.
        warmup = max(1, steps // 20)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
        t0, done, loss = time.monotonic(), 0, float("nan")
        for step in range(steps):
            samples = [demonstration_sample(tok, task, p)
                       for p in task.train_problems(step, ws.batch_size, stream="sft")]
            batch = pack(samples, tok.pad_token_id)
            logp, _ = response_logprobs(model, batch, temperature=1.0,
                                        packed=cfg.learner.packing and saves_slots(batch))
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
        if done < steps:
            log(f"warm start cut short by warm_start.max_seconds: not cached; this run "
                f"starts from it, the next one tries the full {steps} steps again")
        return done

    log(f"warm start: {steps} supervised steps (cached afterwards)")
    return atomic_dir(final, lambda d: None if write(d) == steps else cut_short(final),
                      once=True)


def saves_slots(batch: PackedBatch) -> bool:
    """Whether packing computes a quarter fewer token slots than padding to the longest
    row: on a long-tailed task (demonstrations of 1-48 characters) the padded batch is
    mostly pad and the packed warm start is 2.5x faster; on rows of one length the two
    cost the same and the padded layout stays (the same warm start as before packing)."""
    return packed_layout(batch).tokens <= 0.75 * batch.input_ids.numel()


def cut_short(final: Path) -> Path:
    """Where a warm start cut short by its time bound goes instead of the cache: a
    directory of this run's own (another run cut short with the same key may be using
    its own), never reused."""
    return final.parent / "partial" / f"{final.name}.{uuid.uuid4().hex[:12]}"
