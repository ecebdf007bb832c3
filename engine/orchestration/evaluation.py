"""Held-out evaluation through the rollout engine (the weights it actually serves).

Reports the mean reward and accuracy of ``samples`` completions per prompt at the eval
temperature (the policy as it is trained and served), and greedy accuracy, on the task's
fixed held-out split. A multi-turn task's held-out problems run as trajectories with
their environment (their reward: the sum of its steps'), and also report the share that
called a tool (eval/tool_call_frac).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from engine import metrics as M
from engine.model import encode_prompt
from engine.rollout.base import RolloutEngine, SamplingParams
from engine.rollout.multiturn import TrajectoryRunner, trajectory_metrics
from engine.tasks import Task
from engine.tasks.env import EnvTask
from engine.telemetry.recorder import SpanRecorder


def evaluate(engine: RolloutEngine, task: Task, tokenizer, temperature: float,
             max_new_tokens: int, seed: int, samples: int = 1,
             stop_token_ids: tuple[int, ...] = ()) -> dict[str, float]:
    held_out = task.eval_problems()
    # a multi-turn task's held-out problems are trajectories (their env spans unrecorded,
    # as the single-turn eval's generation is)
    runner = (TrajectoryRunner(engine, task, tokenizer, None, SpanRecorder([]))
              if isinstance(task, EnvTask) else None)
    out: dict[str, float] = {}
    for (reward_mean, accuracy), temp, n in (
            ((M.EVAL_REWARD_MEAN, M.EVAL_ACCURACY), temperature, samples),
            ((M.EVAL_GREEDY_REWARD_MEAN, M.EVAL_GREEDY_ACCURACY), 0.0, 1)):
        params = SamplingParams(temperature=temp, max_new_tokens=max_new_tokens,
                                stop_token_ids=stop_token_ids)
        if runner is not None:
            trajs = runner.run(held_out, n, seed, step=-1, params=params)
            rewards = [t.reward for t in trajs]
            if reward_mean == M.EVAL_REWARD_MEAN:
                out |= trajectory_metrics(trajs)
        else:
            problems = [p for p in held_out for _ in range(n)]
            prompts = [encode_prompt(tokenizer, p.prompt) for p in problems]
            comps = engine.generate(prompts, params, seed)
            texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in comps]
            rewards = _scores(task, problems, texts, [c.finished for c in comps])
        out[reward_mean] = sum(rewards) / len(rewards)
        out[accuracy] = sum(r == 1.0 for r in rewards) / len(rewards)
    return out


def _scores(task: Task, problems, texts, finished) -> list[float]:
    """Each completion's score, in order; a task whose scores wait on processes (sandboxed
    programs) is scored on ``task.score_threads`` threads, the others here (math-verify's
    timeouts are signals, which only the main thread receives)."""
    if task.score_threads <= 1:
        return list(map(task.score, problems, texts, finished))
    with ThreadPoolExecutor(task.score_threads) as pool:
        return list(pool.map(task.score, problems, texts, finished))
