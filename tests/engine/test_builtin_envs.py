"""The built-in code-repair and guessing environments, driven by scripted policies: what
each observes, rewards and ends on, through the seam (reset / step) and through the
trajectory runner (turns, budgets, timeouts, per-turn rewards)."""

import random
import re
from collections import Counter
from pathlib import Path

import pytest

from engine.config import EnvTaskConfig, load_config
from engine.envs.code_repair import CodeRepairEnv
from engine.envs.guess import GuessEnv
from engine.model import load_tokenizer
from engine.orchestration.partial import PartialGroup, Row, continue_trajectories
from engine.rollout.base import Completion, SamplingParams
from engine.rollout.multiturn import TrajectoryRunner
from engine.tasks.base import Problem
from engine.tasks.env import EnvTask
from engine.telemetry.recorder import SpanRecorder
from engine.tinymodel import CHARS

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.toml"))


def in_alphabet(text: str) -> bool:
    return set(text) <= set(CHARS)


# --------------------------------------------------------------------------- code repair


def test_code_repair_shows_the_failing_test_then_rewards_the_fix():
    env = CodeRepairEnv()
    row = env.draw(random.Random(4))
    prompt = env.reset(row)[0]["content"]
    assert prompt.startswith(row["buggy"] + " ") and prompt.endswith(":")
    assert row["buggy"] != row["answer"]

    again = env.step(row["buggy"])                    # the bug, run in the sandbox
    assert not again.done and again.reward == 0.0 and again.info["reason"] == "wrong_answer"
    x, got, want = map(int, re.fullmatch(r"fail (-?\d+) got (-?\d+) want (-?\d+):",
                                         again.observations[0]["content"]).groups())
    assert [x, want] in row["tests"] and got != want

    fixed = env.step(row["answer"])
    assert (fixed.done, fixed.reward, fixed.observations) == (True, 1.0, [])


@pytest.mark.parametrize("program, says", [
    ("f=lambda x:x//0", "error zerodivisionerror:"),
    ("f=lambda x:", "error syntaxerror:"),
    ("g=1", "error keyerror:"),
])
def test_code_repair_says_why_a_program_did_not_run_in_the_model_alphabet(program, says):
    env = CodeRepairEnv(attempt_cost=0.1)
    env.reset(env.draw(random.Random(0)))
    res = env.step(program)
    assert res.observations[0]["content"] == says and not res.done and res.reward == -0.1
    assert in_alphabet(says)


def test_code_repair_prompts_and_demonstrations_are_in_the_model_alphabet():
    env = CodeRepairEnv(demo_fail_frac=1.0)
    rng = random.Random(1)
    for _ in range(50):
        row = env.draw(rng)
        demo = env.demonstration(row, rng)
        assert in_alphabet(env.reset(row)[0]["content"] + "".join(m["content"] for m in demo))
        assert demo[-1]["content"] == row["answer"]
    # the demonstration's failure is what the sandbox says of the buggy program
    env.reset(row)
    assert env.step(demo[0]["content"]).observations == [demo[1]]


class ScriptedPolicy:
    """The rollout seam (a fake at the seam) with a policy written as a function of the
    decoded context: ``turn(context) -> text``; a turn ends on EOS."""

    def __init__(self, tok, turn, version: int = 0):
        self.tok, self.turn, self.version, self.calls = tok, turn, version, 0

    def weight_version(self) -> int:
        return self.version

    def generate(self, prompts, params, seed, on_complete=None, budgets=None):
        self.calls += 1
        out = []
        for ids, cap in zip(prompts, budgets, strict=True):
            text = self.turn(self.tok.decode(ids, skip_special_tokens=True))
            toks = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append(Completion(toks[:cap], [-0.1] * len(toks[:cap]), len(toks) <= cap,
                                  self.version))
        return out


def run_env(tok, env: dict, turn, problems: int = 2, group: int = 1, version: int = 0):
    task = EnvTask(EnvTaskConfig.model_validate({"eval_size": 8, "env": env}))
    runner = TrajectoryRunner(ScriptedPolicy(tok, turn, version), task, tok,
                              SamplingParams(max_new_tokens=24), SpanRecorder(["cpu:0"]))
    trajs = runner.run(task.train_problems(0, problems), group, seed=0, step=0)
    return runner, trajs


def repeat_the_bug_then_fix(context: str) -> str:
    """Sends the prompt's program back once, then the fix the failure points to (the
    test's expected values come from the task's row, looked up by the prompt)."""
    buggy = the_program(context)
    return buggy if "fail" not in context else FIXES[buggy]


def the_program(context: str) -> str:
    return re.match(r"f=lambda x:\S+", context)[0]


FIXES: dict[str, str] = {}


def test_code_repair_trajectories_run_in_the_sandbox_turn_by_turn(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    task = EnvTask(EnvTaskConfig.model_validate({"eval_size": 8,
                                                 "env": {"class": "code_repair"}}))
    for p in task.train_problems(0, 2):
        FIXES[p.row["buggy"]] = p.row["answer"]
    runner, trajs = run_env(tok, {"class": "code_repair", "max_tokens": 96},
                            repeat_the_bug_then_fix)
    for t, s in zip(trajs, runner.samples(trajs), strict=True):
        assert (s.reward, s.finished, s.reason, s.env.turns) == (1.0, True, "pass", 2)
        bug, fix = t.problem.row["buggy"], t.problem.row["answer"]
        assert s.text.startswith(bug) and s.text.endswith(fix)
        obs = s.text[len(bug):-len(fix)]
        assert re.fullmatch(r"fail -?\d+ got -?\d+ want -?\d+:", obs), obs
        # the sandbox's failure is context (mask 0); both programs are the model's (mask 1)
        assert s.loss_mask == [1] * (len(bug) + 1) + [0] * len(obs) + [1] * (len(fix) + 1)
        assert [r.reward for r in s.env.turn_log] == [0.0, 1.0]


def test_code_repair_ends_at_max_turns_or_its_step_timeout_unrewarded(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    runner, trajs = run_env(tok, {"class": "code_repair", "max_turns": 3, "max_tokens": 200},
                            the_program)                     # the bug, again and again
    assert [(t.reason, t.trace.turns, t.reward, t.finished) for t in trajs] == \
        [("max_turns", 3, 0.0, False)] * 2
    # a program that never returns holds its step past task.env.step_timeout_s
    runner, trajs = run_env(tok, {"class": "code_repair", "step_timeout_s": 0.3,
                                  "args": {"timeout_s": 5.0}},
                            lambda context: "while 1:pass", problems=1)
    (t,) = trajs
    assert (t.reason, t.trace.timeouts, t.reward) == ("env_timeout", 1, 0.0)


# --------------------------------------------------------------------------- guess


def test_guess_ranges_are_long_tailed():
    env = GuessEnv(max_bits=8, tail=0.6)
    rng = random.Random(0)
    rows = [env.draw(rng) for _ in range(4000)]
    bits = Counter((r["hi"] - r["lo"] + 1).bit_length() - 1 for r in rows)
    counts = [bits[k] for k in range(1, 9)]
    assert counts == sorted(counts, reverse=True)            # fewer the wider the range
    assert counts[0] > 10 * counts[5] and counts[7] > 0        # yet the widest do come


def bisect(context: str) -> str:
    """The binary search a good policy would run, from the prompt and the hints so far."""
    lo, hi = map(int, re.match(r"guess (\d+) (\d+):", context).groups())
    for guess, hint in re.findall(r"(\d+)(up|down):", context.partition(":")[2]):
        lo, hi = (int(guess) + 1, hi) if hint == "up" else (lo, int(guess) - 1)
    return str((lo + hi) // 2)


def test_guess_hints_up_or_down_and_rewards_guesses_where_the_secret_may_be(tiny_dir):
    env = GuessEnv(turn_reward=0.05)
    env.reset({"lo": 1, "hi": 64, "secret": 40, "answer": "40"})
    assert env.step("32").observations == [{"role": "user", "content": "up:"}]
    assert env.step("48").observations == [{"role": "user", "content": "down:"}]
    assert env.step("30").reward == 0.0               # below 33: the first hint ruled it out
    assert env.step("44").reward == 0.05
    assert (env.step("40").reward, env.step("40").done) == (1.0, True)
    assert env.step("forty").reward == -0.1 and env.step("forty").done

    tok = load_tokenizer(tiny_dir)
    runner, trajs = run_env(tok, {"class": "guess", "max_turns": 12, "max_tokens": 128,
                                  "args": {"turn_reward": 0.05}}, bisect, problems=8)
    for s in runner.samples(trajs):
        wrong = s.env.turns - 1
        width = s.problem.row["hi"] - s.problem.row["lo"] + 1
        assert s.reason == "found" and s.env.turns <= width.bit_length()
        assert [r.reward for r in s.env.turn_log] == [0.05] * wrong + [1.0]
        assert s.reward == pytest.approx(1.0 + 0.05 * wrong)
        assert s.credit is None                     # task.env.reward_credit = "trajectory"
    assert len({t.trace.turns for t in trajs}) > 1                 # a variable turn count


def test_turn_credit_puts_each_steps_reward_on_its_turns_last_token(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    runner, trajs = run_env(tok, {"class": "guess", "max_turns": 12, "max_tokens": 128,
                                  "reward_credit": "turn"}, bisect, problems=4)
    for s in runner.samples(trajs):
        assert s.credit == [(r.end - 1, r.reward) for r in s.env.turn_log]
        assert all(s.loss_mask[t] == 1 and s.response_ids[t] == tok.eos_token_id
                   for t, _ in s.credit)
        assert sum(r for _, r in s.credit) == pytest.approx(s.reward)


# --------------------------------------------------------------------------- configs


@pytest.mark.parametrize("name", ["code_repair_env.toml", "guess_env.toml"])
def test_the_env_presets_name_their_builtin_environment(name):
    cfg = load_config(CONFIGS[0].parent / name)
    assert cfg.task.type == "env" and cfg.model.size == "tiny"


# --------------------------------------------------------------------------- partial rollout


def guess_problem(lo: int, hi: int, secret: int) -> Problem:
    row = {"lo": lo, "hi": hi, "secret": secret, "answer": str(secret)}
    return Problem(f"guess {lo} {hi}:", str(secret), row=row)


def test_a_carried_trajectory_continues_under_the_next_weights_and_records_both(tiny_dir):
    """Partial rollout on the guessing env: the narrow problem's group ends in one turn,
    the wide one's is cut at that turn boundary (the target is one group) and carried,
    context and environment; after a weight sync it ends, its turns of both versions."""
    tok = load_tokenizer(tiny_dir)
    task = EnvTask(EnvTaskConfig.model_validate({"eval_size": 8, "env": {
        "class": "guess", "max_turns": 12, "max_tokens": 96, "args": {"turn_reward": 0.02}}}))
    engine = ScriptedPolicy(tok, bisect, version=4)
    runner = TrajectoryRunner(engine, task, tok, SamplingParams(max_new_tokens=4),
                              SpanRecorder(["cpu:0"]))
    groups = [PartialGroup(guess_problem(10, 10, 10), [Row(), Row()]),      # 1 guess
              PartialGroup(guess_problem(1, 64, 45), [Row(), Row()])]       # 6 guesses

    done, carry = continue_trajectories(runner, groups, target=1, seed=0, step=3)
    assert [[s.reward for s in g] for g in done] == [[1.0, 1.0]]
    (wide,) = carry
    assert wide.recycled == 1 and wide.oldest == 4
    assert all(not t.ended and t.trace.turns == 1 and not t.closed for t in wide.rows)

    engine.version = 5                                    # the weight sync between steps
    done, carry = continue_trajectories(runner, carry, target=1, seed=1, step=4)
    assert carry == []
    for s in done[0]:
        assert (s.reason, s.reward, s.env.turns) == ("found", pytest.approx(1.1), 6)
        assert (s.version, s.last_version, s.mixes_versions, s.recycled) == (4, 5, True, 1)
        assert [r.version for r in s.env.turn_log] == [4, 5, 5, 5, 5, 5]
        assert s.text.startswith("32up:48down:")        # one context across both calls
