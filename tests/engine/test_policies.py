"""Async policy schedules and partial rollout, in process, with fakes at the worker and
engine seams (the real engine runs in test_async_ray.py)."""

import pytest

from engine.api import LogEvent, run_local
from engine.config import (
    FullyAsyncPolicyConfig,
    GrpoConfig,
    OneStepOffPolicyConfig,
    PartialRolloutPolicyConfig,
    SyncPolicyConfig,
)
from engine.experience import (
    ExperienceBuffer,
    Sample,
    StalenessError,
    check_staleness,
    zero_variance,
)
from engine.orchestration.actors import LocalActor
from engine.orchestration.ledger import resume_stream
from engine.orchestration.partial import PartialGroup, Row, continue_groups
from engine.orchestration.policies import Experience, SyncPolicy, build_policy
from engine.orchestration.producer import RolloutProducer, split
from engine.reward import Verdict
from engine.rollout.base import Completion, SamplingParams
from engine.tasks.base import Problem
from engine.telemetry.recorder import SpanRecorder
from engine.telemetry.sinks import MemorySink
from engine.telemetry.step_metrics import group_metrics

from .conftest import checkpointed, small_run

N, G = 4, 2          # groups per step, samples per group


class FakeTask:
    def train_problems(self, step, n, stream="rl"):
        tag = "" if stream == "rl" else f"{stream}:"
        return [Problem(prompt=f"{tag}{step}:{i}", answer="x") for i in range(n)]


class VersionedWorker:
    """Produces groups tagged with the weight version it was last sent."""

    def __init__(self):
        self.version = 0

    def produce(self, step, problems, seed):
        return [[Sample(problem=p, prompt_ids=[1], response_ids=[2], behaviour_logprobs=[0.0],
                        finished=True, version=self.version, group=i) for _ in range(G)]
                for i, p in enumerate(problems)]

    def continue_groups(self, step, groups, target, seed):    # every group completes
        return self.produce(step, [g.problem for g in groups], seed), []


def drive(policy_cfg, steps=6, bound=None):
    """The loop without a learner: returns per-step staleness lists."""
    worker = VersionedWorker()
    buffer = ExperienceBuffer(max_staleness=bound)
    exp = Experience([LocalActor(worker)], FakeTask(), buffer, N, G, seed=0)
    policy = build_policy(policy_cfg, exp, start_version=0)
    seen = []
    for step in range(steps):
        groups = policy.next_batch(step, step)
        assert len(groups) == N
        seen.append(check_staleness([s for g in groups for s in g], step))
        assert max(seen[-1]) <= policy_cfg.staleness_bound, "the policy's own bound holds"
        worker.version = step + 1           # the sync lands before later produce calls
        policy.weights_sent(step + 1)
    return seen, buffer


def test_one_step_off_trains_on_weights_exactly_one_version_old():
    seen, buffer = drive(OneStepOffPolicyConfig())
    assert max(seen[0]) == 0
    assert all(set(s) == {1} for s in seen[1:])
    assert buffer.dropped_stale == 0


@pytest.mark.parametrize("eta", [0, 1, 3])
def test_fully_async_waiting_never_exceeds_eta_and_drops_nothing(eta):
    cfg = FullyAsyncPolicyConfig(max_staleness=eta, on_stale="wait", prompts_per_call=1)
    seen, buffer = drive(cfg, bound=eta)
    assert max(max(s) for s in seen) <= eta
    assert buffer.dropped_stale == 0


def test_fully_async_dropping_counts_every_group_older_than_eta():
    cfg = FullyAsyncPolicyConfig(max_staleness=0, on_stale="drop")
    seen, buffer = drive(cfg, bound=0)
    assert all(set(s) == {0} for s in seen)
    assert buffer.dropped_stale == N * 5      # the batch made during each update goes stale


def test_staleness_check_refuses_negative_and_measures_the_rest():
    s = VersionedWorker().produce(0, [Problem("p", "a")], 0)[0]
    with pytest.raises(StalenessError, match="negative"):
        check_staleness([*s[:1], Sample(**{**s[0].__dict__, "version": 3})], 2)
    assert set(check_staleness(s, 2)) == {2}


def test_split_keeps_order_and_balances():
    assert split(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split([1], 3) == [[1], [], []]


# --------------------------------------------------------------------------- partial rollout

class LengthEngine:
    """Fake engine seam: prompt "L<n>" needs n tokens (token 7, EOS = 0 last); rows end in
    order of the tokens they still need, and an on_complete stop aborts the rest."""

    def __init__(self):
        self.version, self.calls, self.budgets = 0, [], []

    def weight_version(self):
        return self.version

    def generate(self, prompts, params, seed, on_complete=None, budgets=None):
        self.calls.append(prompts)
        self.budgets.append(budgets)
        need = [int(chr(p[0])) - len(p) + 1 for p in prompts]        # prompt is one token
        order = sorted(range(len(prompts)), key=lambda i: need[i])
        out, stop_at = [None] * len(prompts), None
        for i in order:
            if stop_at is not None:
                n = min(stop_at, need[i] - 1)
                out[i] = Completion([7] * n, [-0.5] * n, False, self.version, aborted=True)
                continue
            out[i] = Completion([7] * (need[i] - 1) + [0], [-0.5] * need[i], True, self.version)
            if on_complete(i, out[i]):
                stop_at = need[i]
        return out


class ByteTok:
    eos_token_id = eos_token = None

    def __call__(self, text):
        return {"input_ids": [ord(text[1])]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join("a" for t in ids if t != 0)


class ZeroReward:
    def verdicts(self, problems, texts, finished):
        return [Verdict(0.0, "wrong")] * len(texts)


def test_partial_rollout_stops_at_the_target_and_carries_the_long_tail():
    engine, rec = LengthEngine(), SpanRecorder(["cpu:0"])
    groups = [PartialGroup(Problem(f"L{n}", ""), [Row(), Row()]) for n in (2, 9, 3)]
    params = SamplingParams(max_new_tokens=9)

    done, carry = continue_groups(engine, ZeroReward(), ByteTok(), params, groups, 2, 0, 0, rec)

    assert [g[0].problem.prompt for g in done] == ["L2", "L3"]
    assert [c.problem.prompt for c in carry] == ["L9"]
    assert carry[0].recycled == 1 and all(len(r.token_ids) == 3 for r in carry[0].rows)
    assert not any(s.mixes_versions for g in done for s in g)

    engine.version = 1                       # the learner updated; the carry continues
    done, carry = continue_groups(engine, ZeroReward(), ByteTok(), params, carry, 1, 0, 1, rec)

    assert carry == [] and engine.calls[-1][0] == [ord("9")] + [7] * 3   # prompt + prefix
    assert engine.budgets[-1] == [9 - 3] * 2    # the engine stops each at what it has left
    (group,) = done
    assert all(len(s.response_ids) == 9 and s.finished for s in group)
    assert all(s.version == 0 and s.last_version == 1 and s.mixes_versions for s in group)
    assert all(s.recycled == 1 for s in group)


class TailWorker:
    """A worker over the fake engine: problem i of a call needs 2 tokens, or 9 when i is
    odd; its weights are the version it was last sent."""

    def __init__(self):
        self.engine = LengthEngine()

    @property
    def version(self):
        return self.engine.version

    @version.setter
    def version(self, v):
        self.engine.version = v

    def continue_groups(self, step, groups, target, seed):
        return continue_groups(self.engine, ZeroReward(), ByteTok(), SamplingParams(
            max_new_tokens=9), groups, target, seed, step, SpanRecorder(["gpu:0"]))


class TailTask:
    def train_problems(self, step, n, stream="rl"):
        return [Problem(prompt=f"L{9 if i % 2 else 2}", answer="") for i in range(n)]


def test_interruptible_fully_async_carries_the_tail_and_stays_within_eta():
    worker = TailWorker()
    buffer = ExperienceBuffer(max_staleness=2)
    exp = Experience([LocalActor(worker)], TailTask(), buffer, 2, G, seed=0)
    cfg = FullyAsyncPolicyConfig(max_staleness=2, over_provision=2.0)
    policy = build_policy(cfg, exp, start_version=0)
    mixed = 0
    for step in range(6):
        samples = [s for g in policy.next_batch(step, step) for s in g]
        assert max(check_staleness(samples, step)) <= 2
        mixed += sum(s.mixes_versions for s in samples)
        worker.version = step + 1
        policy.weights_sent(step + 1)
    assert exp.recycled > 0 and mixed > 0     # long rows were continued under new weights


def test_overlapped_partial_rollout_generates_the_next_step_during_the_update():
    """The default form: a step's groups taken, the worker's next call starts before the
    learner's weights change (one step ahead), its tail is carried and continued under the
    next version, and no group trains more than two versions after its first tokens."""
    worker = TailWorker()
    buffer = ExperienceBuffer(max_staleness=2)
    exp = Experience([LocalActor(worker)], TailTask(), buffer, 2, G, seed=0)
    cfg = PartialRolloutPolicyConfig(over_provision=2.0)
    policy = build_policy(cfg, exp, start_version=0)
    assert policy.overlaps and cfg.staleness_bound == 2
    mixed = 0
    for step in range(6):
        samples = [s for g in policy.next_batch(step, step) for s in g]
        assert max(check_staleness(samples, step)) <= 2
        if step:
            assert min(check_staleness(samples, step)) >= 1    # generated a step ahead
        mixed += sum(s.mixes_versions for s in samples)
        worker.version = step + 1
        policy.weights_sent(step + 1)
    assert len(worker.engine.calls) == 7      # one call per step, and the one in flight
    assert exp.recycled > 0 and mixed > 0     # long rows continued under the next weights
    policy.close()


def test_overlap_with_a_staleness_bound_under_two_is_a_field_error():
    from engine.config import ConfigError, validate_config

    with pytest.raises(ConfigError) as err:
        validate_config({"async_policy": {"type": "partial_rollout", "max_staleness": 1}})
    assert "async_policy.max_staleness" in str(err.value) and "overlap = false" in str(
        err.value)
    cfg = validate_config({"async_policy": {"type": "partial_rollout", "max_staleness": 1,
                                            "overlap": False}})
    assert cfg.async_policy.staleness_bound == 1


# --------------------------------------------------------------------------- the driver

def test_a_sample_newer_than_the_learner_is_an_error_event(tmp_path, model_cache, monkeypatch):
    real = RolloutProducer.produce

    def from_the_future(self, step, problems, seed):
        groups = real(self, step, problems, seed)
        for s in (s for g in groups for s in g):
            s.version += 5
        return groups

    monkeypatch.setattr(RolloutProducer, "produce", from_the_future)
    sink = MemorySink()
    with pytest.raises(StalenessError):
        run_local(small_run(steps=1), tmp_path, sink=sink)
    errors = [e.message for e in sink.events if isinstance(e, LogEvent) and e.level == "error"]
    assert any("negative staleness -5" in m for m in errors)


@pytest.mark.parametrize("policy_cfg", [OneStepOffPolicyConfig(), FullyAsyncPolicyConfig(),
                                        PartialRolloutPolicyConfig(over_provision=1.5)])
def test_a_resumed_streaming_run_continues_its_data_and_trains_each_prompt_once(
        policy_cfg, tmp_path):
    def trained_positions(resumed_at, steps):
        ckpt = tmp_path if resumed_at else None
        data = resume_stream(FakeTask(), N, ckpt)
        exp = Experience([LocalActor(VersionedWorker())], FakeTask(), ExperienceBuffer(), N, G,
                         seed=0, resumed_at=resumed_at, data=data)
        policy = build_policy(policy_cfg, exp, start_version=resumed_at)
        positions = []
        for step in range(resumed_at, resumed_at + steps):
            positions += [g[0].problem.position for g in policy.next_batch(step, step)]
            policy.weights_sent(step + 1)
        policy.close()                    # what is still in flight is lost, and pending
        checkpointed(tmp_path, exp.ledger)
        return positions, exp.ledger

    first, _ = trained_positions(0, 3)
    resumed, ledger = trained_positions(3, 3)

    trained = first + resumed
    assert len(trained) == 6 * N and len(set(trained)) == 6 * N
    # every prompt served is trained once or still pending: none skipped, none repeated
    assert sorted(trained + sorted(ledger.pending)) == list(range(ledger.position))
    assert (ledger.skipped, ledger.repeated, ledger.trained) == (0, 0, 6 * N)


# --------------------------------------------------------------------------- dynamic sampling

class AlternatingWorker(VersionedWorker):
    """Every other group it produces is flat (all rewards 1); the rest have one 0 and one 1.
    Counts the groups it produced."""

    def __init__(self, flat=lambda k: k % 2 == 0):
        super().__init__()
        self.produced, self.flat = 0, flat

    def produce(self, step, problems, seed):
        groups = super().produce(step, problems, seed)
        for g in groups:
            g[0].reward = 1.0 if self.flat(self.produced) else 0.0
            g[1].reward = 1.0
            self.produced += 1
        return groups


def _complete(result):
    """A generation call's complete groups (continue_groups returns them with its carry)."""
    return result[0] if isinstance(result, tuple) else result


def dynamic_experience(worker, bound=None, rounds=4):
    alg = GrpoConfig(group_size=G, dynamic_sampling=True, max_resample_rounds=rounds)
    return Experience([LocalActor(worker)], FakeTask(), ExperienceBuffer(max_staleness=bound),
                      N, G, seed=0, algorithm=alg, max_new_tokens=4)


def test_dynamic_sampling_draws_the_missing_groups_until_no_flat_group_is_left():
    worker = AlternatingWorker()
    exp = dynamic_experience(worker)
    policy = build_policy(SyncPolicyConfig(), exp, start_version=0)
    groups = policy.next_batch(0, 0)
    # rounds of 4, 2, 1, 1 groups: 0 1 2 3 | 4 5 | 6 | 7, the even ones flat
    assert len(groups) == N and not any(zero_variance(g) for g in groups)
    assert worker.produced == 8 and exp.dropped == 4
    assert group_metrics(groups, exp.dropped) == {"samples/zero_std_group_frac": 0.5,
                                                  "samples/resampled": 4.0 * G}
    assert len({g[0].problem.prompt for g in groups}) == N    # the rounds draw new problems


def test_dynamic_sampling_stops_at_its_bound_and_returns_what_it_has():
    worker = AlternatingWorker(flat=lambda k: k != 0)         # only the first group varies
    exp = dynamic_experience(worker, rounds=2)
    groups = SyncPolicy(exp).next_batch(0, 0)
    assert len(groups) == 1 and exp.dropped >= 2 * N and exp.exhausted()
    assert worker.produced == len(groups) + exp.dropped <= 1 + 2 * N + N
    exp = dynamic_experience(AlternatingWorker(flat=lambda k: True), rounds=1)
    assert SyncPolicy(exp).next_batch(0, 0) == []


def test_without_dynamic_sampling_flat_groups_train_and_are_counted():
    worker = AlternatingWorker()
    exp = Experience([LocalActor(worker)], FakeTask(), ExperienceBuffer(), N, G, seed=0,
                     algorithm=GrpoConfig(group_size=G), max_new_tokens=4)
    groups = SyncPolicy(exp).next_batch(0, 0)
    assert worker.produced == N and sum(zero_variance(g) for g in groups) == 2
    assert group_metrics(groups, exp.dropped)["samples/zero_std_group_frac"] == 0.5


@pytest.mark.parametrize("policy_cfg", [OneStepOffPolicyConfig(),
                                        FullyAsyncPolicyConfig(max_staleness=1,
                                                               prompts_per_call=1),
                                        PartialRolloutPolicyConfig(over_provision=1.5),
                                        PartialRolloutPolicyConfig(over_provision=1.5,
                                                                   overlap=False,
                                                                   max_staleness=1)])
def test_every_policy_hands_the_learner_no_flat_group_within_its_staleness_bound(policy_cfg):
    worker = AlternatingWorker()
    exp = dynamic_experience(worker, bound=policy_cfg.staleness_bound)
    policy = build_policy(policy_cfg, exp, start_version=0)
    trained = dropped = 0
    for step in range(6):
        groups = policy.next_batch(step, step)
        assert len(groups) == N and not any(zero_variance(g) for g in groups)
        assert max(check_staleness([s for g in groups for s in g], step)) <= \
            policy_cfg.staleness_bound
        trained, dropped = trained + len(groups), dropped + exp.dropped
        worker.version = step + 1
        policy.weights_sent(step + 1)
    # every group drawn is trained, dropped (and counted), buffered or still in flight
    in_flight = sum(len(_complete(g.future.result()))
                    for g in getattr(policy, "inflight", {}).values())
    assert worker.produced == trained + dropped + len(exp.buffer) + in_flight
    assert dropped > 0
    policy.close()


def test_overlong_filter_and_penalty_shape_groups_as_they_enter():
    def group():
        return [Sample(Problem("p", "a"), [1], [2] * n, [0.0] * n, finished=n < 4, version=0,
                       group=0, reward=1.0) for n in (2, 4)]

    exp = Experience([], FakeTask(), ExperienceBuffer(), N, G, seed=0,
                     algorithm=GrpoConfig(overlong={"type": "filter"}), max_new_tokens=4)
    exp.admit(g := group())
    assert [s.in_loss for s in g] == [True, False] and [s.shaping for s in g] == [0.0, 0.0]
    exp = Experience([], FakeTask(), ExperienceBuffer(), N, G, seed=0,
                     algorithm=GrpoConfig(dynamic_sampling=True,
                                          overlong={"type": "penalty", "buffer_len": 2}),
                     max_new_tokens=4)
    assert exp.admit(g := group())           # the penalty makes equal rewards differ
    assert [s.learning_reward for s in g] == [1.0, 0.0] and all(s.in_loss for s in g)
