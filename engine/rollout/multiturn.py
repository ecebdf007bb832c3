"""Multi-turn rollout: trajectories that interleave generation with environment steps.

    start: one fresh environment per trajectory; reset(row) -> the prompt   [span: env]
    advance: while any trajectory is live (and, partial rollout, not enough() groups
             have ended), each live one's next turn, bounded by its own task.env.max_turns:
        engine.generate(live contexts, stops = EOS + the env's stop tokens,
                        budgets = each one's tokens left, at most max_new_tokens)
                                                                            [span: rollout]
            a turn cut by its budget ends its trajectory (unfinished)
        env.step(turn text) of each turn the moment it ends (on_complete), on a thread
            of its own while the rest still decode (task.env.workers = "ray": the thread
            waits on a pool actor, engine.envs.pool), bounded by task.env.step_timeout_s;
            all waited for before the next turn                             [span: env]
            done -> finished; raised / timed out -> ended (env_error / env_timeout)
            else the observations' tokens are appended to the context (loss mask 0;
            with a chat template, its rendering of them: engine.rollout.turns), cut at
            the trajectory's token budget (then it ends, unfinished)
        env.close() of those that ended, where it has one, bounded alike    [span: env]
    -> one Sample per trajectory: response = turns and observations, loss_mask, reward =
       the sum of its steps' rewards, version = the oldest that generated a turn,
       env.turn_log = each turn's tokens, version and step reward (and, with
       task.env.reward_credit = "turn", credit: each step's reward on its turn's end)

It drives the rollout seam (engine.rollout.base.RolloutEngine): each turn hands the
engine the trajectory's whole context, and the engine's prefix cache feeds only what the
last turn added (the torch sampler's engine.rollout.prefix_cache, vLLM's prefix caching;
both dropped when the weights change, so a carried trajectory's next turn under new
weights is fed whole). Turns of different trajectories
are batched into one generate call; an early finisher's environment step (a tool call)
runs while the batch's longer turns still decode, and overlaps the other steps. A
trajectory that ``advance`` leaves live (partial rollout:
engine.orchestration.partial.continue_trajectories) goes on in a later call, under the
weights served then.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine import metrics as M
from engine.envs.base import EnvCalls, Outcome, StepResult, call_all
from engine.envs.pool import env_pool
from engine.experience import EnvTrace, Sample, TurnRecord
from engine.model import encode_prompt
from engine.rollout.base import Completion, RolloutEngine, SamplingParams
from engine.rollout.turns import TurnTemplate
from engine.tasks.base import Problem
from engine.tasks.env import EnvTask
from engine.telemetry.recorder import SpanRecorder


@dataclass
class Trajectory:
    problem: Problem
    env: Any
    group: int
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    reward: float = 0.0
    reason: str = ""
    finished: bool = False
    ended: bool = False
    trace: EnvTrace = field(default_factory=EnvTrace)
    end_s: float = 0.0
    closed: bool = False              # ended, and its environment's close was called
    recycled: int = 0                 # calls it was carried over unfinished (partial)

    @property
    def version(self) -> int | None:
        """The oldest version that generated a turn of it (None: none yet), as a partial
        rollout's Row says (engine.orchestration.partial)."""
        return min(self.versions, default=None)

    def end(self, reason: str, finished: bool = False) -> None:
        self.ended, self.reason, self.finished = True, reason, finished
        self.end_s = time.monotonic()

    def append(self, ids: list[int], logprobs: list[float] | None) -> None:
        self.response_ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.mask += [1 if logprobs is not None else 0] * len(ids)


def as_step_result(value: Any) -> StepResult:
    """A step's return: a StepResult, or the (observations, reward, done, info) tuple
    gym-style environments return."""
    if isinstance(value, StepResult):
        return value
    if isinstance(value, tuple) and len(value) == 4:
        return StepResult(list(value[0]), float(value[1]), bool(value[2]), dict(value[3]))
    raise TypeError(f"step returned a {type(value).__name__}; return a StepResult or "
                    "(observations, reward, done, info)")


def stop_ids(tok, stops: tuple[str, ...]) -> tuple[int, ...]:
    """The token of each of an environment's stop strings (each must be one token)."""
    out = []
    for s in stops:
        ids = tok(s, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"the environment's stop {s!r} is {len(ids)} tokens of this "
                             "tokenizer; a turn can only stop on one token")
        out.append(ids[0])
    return tuple(out)


class TrajectoryRunner:
    """Runs a batch of trajectories of an environment task on a rollout engine."""

    """``params``: the run's sampling (each run() may give its own, an eval's); ``wrap``:
    what each trajectory's environment is wrapped in (engine.faults.wrap_env)."""

    def __init__(self, engine: RolloutEngine, task: EnvTask, tokenizer,
                 params: SamplingParams | None, recorder: SpanRecorder,
                 log: Callable[..., None] | None = None,
                 wrap: Callable[[Any], Any] = lambda env: env):
        self.engine, self.task, self.tok, self.rec = engine, task, tokenizer, recorder
        self.wrap = wrap
        self.cfg = task.cfg.env
        self.stops = stop_ids(tokenizer, task.stop)
        self.turns = TurnTemplate(tokenizer)
        self.pool = env_pool(self.cfg.ray_actors) if self.cfg.workers == "ray" else None
        self.params = params
        self.log = log

    def _turn_params(self, params: SamplingParams) -> SamplingParams:
        return SamplingParams(temperature=params.temperature, top_p=params.top_p,
                              max_new_tokens=params.max_new_tokens,
                              ignore_eos=params.ignore_eos,
                              stop_token_ids=(*params.stop_token_ids, *self.stops),
                              continues=True)

    def _calls(self, trajs: list[Trajectory], calls: list[Callable[[], Any]],
               step: int, version: int) -> list[Outcome]:
        """The environment calls of ``trajs``, at once (see _settle)."""
        return self._settle(trajs, call_all(calls, self.cfg.step_timeout_s), step, version)

    def _settle(self, trajs: list[Trajectory], outcomes: list[Outcome], step: int,
                version: int) -> list[Outcome]:
        """The outcomes of the environment calls of ``trajs``, each an env span; failures
        end their trajectory and are counted (and said once, through ``log``)."""
        for t, o in zip(trajs, outcomes, strict=True):
            self.rec.record("env", o.start, o.end, step, version)
            t.trace.step_s.append(o.seconds)
            if o.status == "timeout":
                t.trace.timeouts += 1
                t.end("env_timeout")
            elif o.status == "error":
                t.trace.errors += 1
                t.end("env_error")
                if self.log is not None:
                    self.log(f"environment {self.cfg.class_!r} raised {o.detail}",
                             level="warning")
        return outcomes

    def run(self, problems: list[Problem], group_size: int, seed: int, step: int,
            params: SamplingParams | None = None) -> list[Trajectory]:
        """``group_size`` trajectories of each problem, each run to its end."""
        trajs = self.start(problems, group_size, step)
        self.advance(trajs, seed, step, params)
        return trajs

    def start(self, problems: list[Problem], group_size: int, step: int) -> list[Trajectory]:
        """Fresh trajectories, ``group_size`` per problem in order, each reset by its own
        environment (one whose reset failed has ended already)."""
        version = self.engine.weight_version()
        trajs = [Trajectory(p, self.task.new_env(), i // group_size,
                            prompt_ids=encode_prompt(self.tok, p.prompt))
                 for i, p in enumerate(q for q in problems for _ in range(group_size))]
        opened = self._calls(trajs, [lambda t=t: self._env(t).reset(t.problem.row)
                                     for t in trajs], step, version)
        for t, o in zip(trajs, opened, strict=True):
            if not t.ended:                    # this trajectory's own environment's opening
                t.prompt_ids = self.turns.opening(o.value)
        return trajs

    def advance(self, trajs: list[Trajectory], seed: int, step: int,
                params: SamplingParams | None = None,
                enough: Callable[[], bool] = lambda: False) -> None:
        """Turn by turn over every live trajectory until each has ended, or, checked
        before each turn, ``enough()`` (partial rollout: the rest go on in a later call,
        under the weights served then). Each trajectory keeps its own turn count, so one
        carried over ends at task.env.max_turns all the same. The environments of those
        that ended are closed."""
        params = self._turn_params(params or self.params)
        version = self.engine.weight_version()
        start = time.monotonic()
        for rnd in range(self.cfg.max_turns):
            live = [t for t in trajs if not t.ended]
            if not live or enough():
                break
            budgets = [min(params.max_new_tokens, self.cfg.max_tokens - len(t.response_ids))
                       for t in live]
            steps = EnvCalls(self.cfg.step_timeout_s)
            started: dict[int, int] = {}       # live row -> its place among steps' calls
            step_now = self._stepper(live, steps, started)
            with self.rec.phase("rollout", step, version):
                outs = self.engine.generate([t.prompt_ids + t.response_ids for t in live],
                                            params, seed=seed + 7919 * rnd, budgets=budgets,
                                            on_complete=step_now)
            stepping = []
            for i, (t, o) in enumerate(zip(live, outs, strict=True)):
                t.trace.turn_log.append(TurnRecord(len(t.response_ids),
                                                   len(t.response_ids) + len(o.token_ids),
                                                   o.version))
                t.append(o.token_ids, o.logprobs)
                t.versions.append(o.version)
                t.trace.turns += 1
                if not o.finished:              # its budget, not a stop token, ended it
                    t.end("truncated")
                    continue
                step_now(i, o)
                stepping.append((i, t))
            done = steps.wait()                # every step, before the next turn
            stepped = [t for _, t in stepping]
            outcomes = self._settle(stepped, [done[started[i]] for i, _ in stepping],
                                    step, version)
            for t, o in zip(stepped, outcomes, strict=True):
                if not t.ended:
                    self._observe(t, o.value, last=t.trace.turns >= self.cfg.max_turns)
        for t in trajs:
            if not t.ended and t.trace.turns >= self.cfg.max_turns:
                t.end("max_turns")
            if t.ended and not t.closed:
                # one that ended at its reset generated nothing: it is of this call's version
                t.versions = t.versions or [version]
                t.end_s = max(0.0, t.end_s - start)     # (0: it ended at its reset)
        self._close([t for t in trajs if t.ended and not t.closed], step, version)

    def _env(self, t: Trajectory) -> Any:
        """What the calls of ``t``'s environment go through: the run's wrapper (faults),
        and with task.env.workers = "ray" the pool's actors (engine.envs.pool)."""
        return self.wrap(t.env if self.pool is None else self.pool.proxy(t))

    def _stepper(self, live: list[Trajectory], steps: EnvCalls,
                 started: dict[int, int]) -> Callable[[int, Completion], bool]:
        """generate's on_complete: a turn that ends on a stop token has its step started
        at once, on a thread of its own, while the rest of the batch still decodes (an
        engine that calls no on_complete has them started after the call)."""
        def step_now(i: int, c: Completion) -> bool:
            if c.finished and i not in started:
                text = self.tok.decode(c.token_ids, skip_special_tokens=True)
                started[i] = steps.start(lambda: self._env(live[i]).step(text))
            return False

        return step_now

    def _close(self, trajs: list[Trajectory], step: int, version: int) -> None:
        """Each environment's close, bounded like its steps; one that raises or hangs is
        counted (it changes nothing of its finished trajectory)."""
        for t, o in zip(*close_envs(trajs, self.cfg.step_timeout_s, self._env), strict=True):
            self.rec.record("env", o.start, o.end, step, version)
            t.trace.errors += int(o.status == "error")
            t.trace.timeouts += int(o.status == "timeout")
            if o.status == "error" and self.log is not None:
                self.log(f"environment {self.cfg.class_!r} raised {o.detail}",
                         level="warning")

    def samples(self, trajs: list[Trajectory]) -> list[Sample]:
        """One Sample per trajectory (its group: its problem's place in the batch)."""
        return [Sample(problem=t.problem, prompt_ids=t.prompt_ids,
                       response_ids=t.response_ids, behaviour_logprobs=t.logprobs,
                       finished=t.finished, version=min(t.versions),
                       group=t.group,
                       text=self.tok.decode(t.response_ids, skip_special_tokens=True),
                       reward=t.reward, reason=t.reason, gen_s=t.end_s,
                       last_version=max(t.versions) if len(set(t.versions)) > 1 else None,
                       loss_mask=t.mask, env=t.trace, recycled=t.recycled,
                       credit=self._credit(t))
                for t in trajs]

    def _credit(self, t: Trajectory) -> list[tuple[int, float]] | None:
        """task.env.reward_credit = "turn": each stepped turn's reward on its last token."""
        if self.cfg.reward_credit != "turn":
            return None
        return [(r.end - 1, r.reward) for r in t.trace.turn_log if r.end > r.start]

    def _observe(self, t: Trajectory, value: Any, last: bool) -> None:
        try:
            res = as_step_result(value)
        except TypeError as exc:
            t.trace.errors += 1
            t.end("env_error")
            if self.log is not None:
                self.log(f"environment {self.cfg.class_!r}: {exc}", level="warning")
            return
        t.reward += float(res.reward)
        t.trace.turn_log[-1].reward = float(res.reward)
        if res.info.get("tool_call"):
            t.trace.tool_calls += 1
        if res.done:
            t.end(str(res.info.get("reason", "done")), finished=True)
            return
        if last:
            t.end("max_turns")
            return
        obs = self.turns.after(t.response_ids[t.trace.turn_log[-1].start:], res.observations)
        room = self.cfg.max_tokens - len(t.response_ids)
        t.append(obs[:room], None)
        if len(obs) >= room:                    # no room left for the model's next turn
            t.end("max_tokens")


def close_envs(trajs: list[Trajectory], timeout_s: float,
               env_of: Callable[[Trajectory], Any] = lambda t: t.env
               ) -> tuple[list[Trajectory], list[Outcome]]:
    """The close of each trajectory's environment (as ``env_of`` calls it), once (each is
    marked closed): those that have one, at once, each bounded by ``timeout_s``; returns
    them and the outcomes."""
    for t in trajs:
        t.closed = True
    having = [t for t in trajs if hasattr(t.env, "close")]
    return having, call_all([env_of(t).close for t in having], timeout_s)


def trajectory_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """A held-out evaluation's figures of its trajectories: the share that called a tool."""
    n = max(len(trajs), 1)
    return {M.EVAL_TOOL_CALL_FRAC: sum(t.trace.tool_calls > 0 for t in trajs) / n}
