"""Partial rollout (APRIL): stop at the batch target, carry the long tail into the next step.

    step k:  groups = carried (unfinished) + fresh problems, ceil(N x over_provision) in all
             worker: generate every unfinished row (prompt + its tokens so far), and stop
                     as soon as N groups have all their rows done    (on_complete -> True)
             complete groups -> reward -> buffer;  the rest -> carried into step k+1
    step k+1: a carried row continues under the new weights; its sample then mixes
             versions: version = the oldest (its staleness), last_version = the newest

A row's remaining budget is max_new_tokens minus the tokens it has, and the engine stops
it there (generate's ``budgets``): a carried row past its budget would otherwise hold the
call open for tokens that are cut away, and count as complete only at the full budget.
Carried groups that would train more than the policy's staleness bound after their oldest
tokens are dropped (and counted) before they cost more generation (PartialRolloutPolicy,
engine.orchestration.policies).

A multi-turn task's rows are trajectories (continue_trajectories): fresh rows start with
their environment's reset, every live one takes turns, and the call stops at a turn
boundary once ``target`` groups have ended; a trajectory carried over keeps its context,
its environment (with the state it has: pickled when a Ray worker returns it) and its
turn count, and its next turn is generated under the weights served then, so its sample
records both versions (each turn's in Sample.env.turn_log).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from engine.experience import Sample
from engine.model import encode_prompt
from engine.reward import RewardFn
from engine.rollout.base import Completion, RolloutEngine, SamplingParams
from engine.rollout.multiturn import Trajectory, TrajectoryRunner
from engine.tasks.base import Problem
from engine.telemetry.recorder import SpanRecorder


@dataclass
class Row:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version: int | None = None        # oldest version among its tokens (None: no tokens)
    last_version: int | None = None
    done: bool = False                # EOS or budget reached
    finished: bool = False            # EOS
    routing: np.ndarray | None = None  # per fed token (prompt + tokens[:-1], L, k)

    def extend(self, c: Completion, budget: int) -> Row:
        room = budget - len(self.token_ids)
        ids, lps = c.token_ids[:room], c.logprobs[:room]
        if not ids:
            return self
        finished = c.finished and len(c.token_ids) <= room
        return Row(self.token_ids + ids, self.logprobs + lps,
                   c.version if self.version is None else self.version, c.version,
                   done=not c.aborted or len(self.token_ids) + len(ids) >= budget,
                   finished=finished, routing=self._extend_routing(c, len(ids)))

    def _extend_routing(self, c: Completion, kept: int) -> np.ndarray | None:
        """A continuation re-feeds the prompt and this row's tokens: every position keeps
        the routing of the call that first fed it (the one that sampled the token after
        it), and the continuation's covers the rest, cut to the ``kept`` tokens."""
        if c.routing is None:
            return None
        new = c.routing[:len(c.routing) - (len(c.token_ids) - kept)]
        if self.routing is None:
            return new
        return np.concatenate([self.routing, new[len(self.routing):]])


@dataclass
class PartialGroup:
    problem: Problem
    rows: list[Row] | list[Trajectory]     # a multi-turn task's: trajectories once started
    recycled: int = 0                 # steps it has been carried over

    @property
    def oldest(self) -> int | None:
        return min((r.version for r in self.rows if r.version is not None), default=None)


def continue_groups(engine: RolloutEngine, reward: RewardFn, tok, params: SamplingParams,
                    groups: list[PartialGroup], target: int, seed: int, step: int,
                    rec: SpanRecorder) -> tuple[list[list[Sample]], list[PartialGroup]]:
    """Generate until ``target`` groups are complete; returns (complete groups as samples,
    the unfinished groups to carry)."""
    prompt = [encode_prompt(tok, g.problem.prompt) for g in groups]
    todo = [(gi, ri) for gi, g in enumerate(groups) for ri, r in enumerate(g.rows) if not r.done]
    left = [sum(not r.done for r in g.rows) for g in groups]
    complete = sum(n == 0 for n in left)
    budget = params.max_new_tokens

    gen_s: dict[tuple[int, int], float] = {}   # (group, row) -> seconds into this call

    def on_complete(i: int, c: Completion) -> bool:
        nonlocal complete
        gen_s[todo[i]] = time.monotonic() - start
        gi = todo[i][0]
        left[gi] -= 1
        complete += left[gi] == 0
        return complete >= target

    rows = [list(g.rows) for g in groups]
    if todo and complete < target:
        inputs = [prompt[gi] + groups[gi].rows[ri].token_ids for gi, ri in todo]
        with rec.phase("rollout", step, engine.weight_version()):
            start = time.monotonic()
            outs = engine.generate(inputs, params, seed, on_complete=on_complete,
                                   budgets=[budget - len(groups[gi].rows[ri].token_ids)
                                            for gi, ri in todo])
        for (gi, ri), c in zip(todo, outs, strict=True):
            rows[gi][ri] = rows[gi][ri].extend(c, budget)
    done = [gi for gi in range(len(groups)) if all(r.done for r in rows[gi])]
    with rec.phase("reward", step, engine.weight_version()):
        owners = [groups[gi].problem for gi in done for _ in rows[gi]]
        flat = [r for gi in done for r in rows[gi]]
        texts = [tok.decode(r.token_ids, skip_special_tokens=True) for r in flat]
        verdicts = reward.verdicts(owners, texts, [r.finished for r in flat]) if flat else []
    samples, k = [], 0
    for n, gi in enumerate(done):
        group = []
        for ri, r in enumerate(rows[gi]):
            group.append(Sample(
                problem=groups[gi].problem, prompt_ids=prompt[gi], response_ids=r.token_ids,
                behaviour_logprobs=r.logprobs, finished=r.finished, version=r.version,
                group=n, text=texts[k], reward=verdicts[k].reward, reason=verdicts[k].reason,
                recycled=groups[gi].recycled, last_version=r.last_version,
                gen_s=gen_s.get((gi, ri)), routing=r.routing))
            k += 1
        samples.append(group)
    finished_groups = set(done)
    carry = [replace(groups[gi], rows=rows[gi], recycled=groups[gi].recycled + 1)
             for gi in range(len(groups)) if gi not in finished_groups]
    return samples, carry


def continue_trajectories(runner: TrajectoryRunner, groups: list[PartialGroup], target: int,
                          seed: int, step: int
                          ) -> tuple[list[list[Sample]], list[PartialGroup]]:
    """continue_groups for a multi-turn task: (ended groups as samples, the groups to
    carry). A group's rows are all fresh (Row(): started here) or all trajectories."""
    fresh = [g for g in groups if isinstance(g.rows[0], Row)]
    started = runner.start([g.problem for g in fresh], len(fresh[0].rows) if fresh else 1,
                           step)
    trajs: list[list[Trajectory]] = []
    for g in groups:
        if isinstance(g.rows[0], Row):
            trajs.append(started[:len(g.rows)])
            started = started[len(g.rows):]
        else:
            trajs.append(list(g.rows))

    def ended(ts: list[Trajectory]) -> bool:
        return all(t.ended for t in ts)

    runner.advance([t for ts in trajs for t in ts], seed, step,
                   enough=lambda: sum(ended(ts) for ts in trajs) >= target)
    samples, carry = [], []
    for g, ts in zip(groups, trajs, strict=True):
        if not ended(ts):
            for t in ts:
                t.recycled += 1
            carry.append(replace(g, rows=ts, recycled=g.recycled + 1))
            continue
        for t in ts:
            t.group = len(samples)
        samples.append(runner.samples(ts))
    return samples, carry
