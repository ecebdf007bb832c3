"""The served reward model: a tiny transformer classifier, trained on the task's own
examples, answering from a Ray actor that batches concurrent requests.

    dir = ensure_reward_model(cfg.reward, cfg.task)      # trained once, cached like the policy
        positives: the task's answers; negatives: string corruptions of them (a digit
        changed, a character dropped or doubled, an operator swapped, another answer)
    server = start_server(dir, cfg.reward)               # Ray actor RewardModelServer
    p = ray.get(server.score.remote(prompt, text))       # P(correct) in [0, 1]
        requests that arrive within batch_wait_ms share one forward pass (<= max_batch)

    heldout_agreement(task, score_many)   # Pearson r and agreement with the verifier
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from engine.config import RewardModelConfig
from engine.reward.verdict import Verdict
from engine.tasks import build_task
from engine.tasks.base import Problem, Task
from engine.tinymodel import BOS, PAD, VOCAB, _key, atomic_dir, cache_root

MAX_LEN = 64
CLASSIFIER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=1,
                  num_key_value_heads=1, head_dim=64, intermediate_size=128)


def encode(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded char ids (B, T) and attention mask (B, T); <bos> first."""
    rows = [[VOCAB[BOS]] + [VOCAB.get(ch, VOCAB["<unk>"]) for ch in t][:MAX_LEN - 1]
            for t in texts]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), VOCAB[PAD], dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = torch.tensor(r)
        mask[b, :len(r)] = 1
    return ids, mask


def classify(model: LlamaForSequenceClassification, texts: list[str]) -> list[float]:
    ids, mask = encode(texts)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]      # (B,)
    return torch.sigmoid(logits).tolist()


def corrupt(answer: str, other: str, rng: random.Random) -> str:
    """A near miss of ``answer`` (may rarely equal it; labels come from the comparison)."""
    i = rng.randrange(len(answer))
    digits = [j for j, ch in enumerate(answer) if ch.isdigit()]
    ops = [j for j, ch in enumerate(answer) if ch in "+-*"]
    kind = rng.choice(["digit", "drop", "double", "op", "other"])
    if kind == "digit" and digits:
        j = rng.choice(digits)
        return answer[:j] + rng.choice("0123456789".replace(answer[j], "")) + answer[j + 1:]
    if kind == "op" and ops:
        j = rng.choice(ops)
        return answer[:j] + rng.choice("+-*".replace(answer[j], "")) + answer[j + 1:]
    if kind == "drop":
        return answer[:i] + answer[i + 1:]
    if kind == "double":
        return answer[:i] + answer[i] + answer[i:]
    return other


def examples(task: Task, problems: list[Problem], rng: random.Random) -> list[tuple[str, str]]:
    """(prompt, completion) pairs: each problem's answer and one corruption of it."""
    out = []
    for p in problems:
        out.append((p.prompt, p.answer))
        out.append((p.prompt, corrupt(p.answer, rng.choice(problems).answer, rng)))
    return out


def ensure_reward_model(cfg: RewardModelConfig, task_cfg) -> Path:
    key = _key({"task": task_cfg.model_dump(mode="json"), "vocab": VOCAB, "arch": CLASSIFIER,
                "train": [cfg.train_steps, cfg.batch_size], "v": 2})

    def write(d: Path) -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)     # a 2-layer, 64-wide model: more threads only contend
        try:
            train(d)
        finally:
            torch.set_num_threads(threads)

    def train(d: Path) -> None:
        torch.manual_seed(0)
        task, rng = build_task(task_cfg), random.Random(0)
        model = LlamaForSequenceClassification(LlamaConfig(
            vocab_size=len(VOCAB), num_labels=1, pad_token_id=VOCAB[PAD],
            max_position_embeddings=MAX_LEN, **CLASSIFIER)).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(cfg.train_steps):
            pairs = examples(task, task.train_problems(step, cfg.batch_size // 2, "rm"), rng)
            ids, mask = encode([p + t for p, t in pairs])
            labels = torch.tensor([float(t == pairs[2 * (k // 2)][1])
                                   for k, (_, t) in enumerate(pairs)])
            logits = model(input_ids=ids, attention_mask=mask).logits[:, 0]   # (B,)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.save_pretrained(d, safe_serialization=True)
        (d / "training.json").write_text(json.dumps({"final_loss": float(loss.detach())}))

    return atomic_dir(cache_root() / "reward_models" / f"rm-{key}", write, once=True)


def heldout_agreement(task: Task, score_many: Callable[[list[tuple[str, str]]], list[float]],
                      n_problems: int = 32) -> dict[str, float]:
    """On held-out problems (answers and corruptions): Pearson r of the RM's score with the
    verifier's verdict (1 = correct), and how often RM > 0.5 agrees with the verifier."""
    problems = task.eval_problems()[:n_problems]
    pairs = examples(task, problems, random.Random(1))
    owners = [p for p in problems for _ in range(2)]
    truth = np.asarray([task.score(p, t, True) == 1.0 for p, (_, t) in zip(owners, pairs,
                                                                         strict=True)])
    scores = np.asarray(score_many(pairs))
    r = float(np.corrcoef(scores, truth.astype(float))[0, 1])
    return {"pearson_r": r, "agreement": float(((scores > 0.5) == truth).mean()),
            "n": float(len(pairs))}


class RewardModelServer:
    """Hosted as an async Ray actor: score() calls that arrive close together are answered
    by one forward pass."""

    def __init__(self, model_dir: str, max_batch: int, batch_wait_ms: float):
        torch.set_num_threads(1)
        self.model = LlamaForSequenceClassification.from_pretrained(model_dir).eval()
        self.max_batch, self.wait_s = max_batch, batch_wait_ms / 1000
        self.pending: list[tuple[str, asyncio.Future]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.batches: list[int] = []

    async def score(self, prompt: str, text: str) -> float:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((prompt + text, fut))
        if len(self.pending) >= self.max_batch:
            self._flush()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(self.wait_s, self._flush)
        return await fut

    def _flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.pending = self.pending[:self.max_batch], self.pending[self.max_batch:]
        for (_, fut), s in zip(batch, classify(self.model, [t for t, _ in batch]), strict=True):
            fut.set_result(s)
        self.batches.append(len(batch))
        if self.pending:
            self.timer = asyncio.get_running_loop().call_later(self.wait_s, self._flush)

    async def batch_sizes(self) -> list[int]:
        """Sizes of the forward passes since the last call."""
        out, self.batches = self.batches, []
        return out


def start_server(model_dir: Path, cfg: RewardModelConfig):
    import ray

    from engine.reward.service import ensure_ray

    ensure_ray()
    return ray.remote(num_cpus=0)(RewardModelServer).remote(
        str(model_dir), cfg.max_batch, cfg.batch_wait_ms)


class RewardModelJudge:
    """The RM's P(correct) is the reward; the task's verifier is scored alongside."""

    def __init__(self, verifier, server):
        self.kind, self.verifier, self.server = verifier.kind, verifier, server

    def judge(self, problem: Problem, text: str, finished: bool) -> Verdict:
        import ray

        ref = self.server.score.remote(problem.prompt, text)
        v = self.verifier.judge(problem, text, finished)
        return Verdict(ray.get(ref), v.reason, verifier=v.reward)
