"""Multi-turn tasks (task.type = "env"): the config, the environment seam, and
trajectories on the torch sampler (the loss mask over the model's own tokens, env/*
telemetry and faults: test_env_training.py)."""

import asyncio
import random
import threading
import time

import pytest

from engine import metrics as M
from engine.config import (
    ConfigError,
    EnvTaskConfig,
    PartialRolloutPolicyConfig,
    dump_config,
    load_config,
    loads_config,
    validate_config,
)
from engine.envs.base import EnvCalls, _CallThreads, call_all
from engine.envs.calculator import CalculatorEnv
from engine.events import TrajectoryTurn
from engine.experience import EnvTrace, ExperienceBuffer, Sample
from engine.learner.batch import pack
from engine.learner.warmstart import demonstration_sample
from engine.model import encode_prompt, load_tokenizer
from engine.orchestration.partial import PartialGroup
from engine.orchestration.policies import Experience, PartialRolloutPolicy, StreamingPolicy
from engine.rollout.base import Completion, SamplingParams
from engine.rollout.multiturn import Trajectory, TrajectoryRunner
from engine.rollout.torch_backend import TorchRollout
from engine.rollout.turns import TurnTemplate
from engine.tasks import Problem
from engine.tasks.env import EnvTask
from engine.telemetry.recorder import SpanRecorder
from engine.telemetry.samples import samples_event
from engine.telemetry.step_metrics import env_metrics

from .hf_models import build_hf_model


def env_task(**env) -> dict:
    return {"type": "env", "eval_size": 8, "env": env}


def field_error(data: dict) -> tuple[str, str]:
    with pytest.raises(ConfigError) as exc:
        validate_config(data)
    return exc.value.errors[0]


# --------------------------------------------------------------------------- config


def test_an_env_task_round_trips_through_toml_with_its_class_key():
    cfg = validate_config({"task": env_task(**{"class": "calculator", "max_turns": 3,
                                               "args": {"digits": 1}})})
    text = dump_config(cfg)
    assert '[task.env]\nclass = "calculator"' in text
    assert loads_config(text) == cfg
    assert cfg.task.env.class_ == "calculator" and cfg.task.env.args == {"digits": 1}


@pytest.mark.parametrize("spec, says", [
    ("os.path:join", "names a module of the standard library; point it at your own"),
    ("engine.envs.calculator:CalculatorEnv", "names a module of rlplane; point it at your"),
    ("missing_env.py:Env", "no such file 'missing_env.py'; fix the path"),
    ("calculater", "neither a built-in environment (calculator, code_repair, guess) nor"),
    ("my_envs.py:", 'must be "package.module:Class" or "path/to/file.py:Class"'),
])
def test_a_bad_env_class_is_a_field_error_naming_the_fix(spec, says):
    field, message = field_error({"task": env_task(**{"class": spec})})
    assert field == "task.env.class" and says in message, message


def test_a_stdlib_file_named_by_its_path_is_refused_like_its_module():
    import os

    field, message = field_error({"task": env_task(**{"class": f"{os.__file__}:PathLike"})})
    assert field == "task.env.class" and "the standard library" in message


@pytest.mark.parametrize("section, values, field", [
    ("reward", {"type": "math"}, "reward.type"),
    ("task", env_task(reward_credit="turn"), "task.env.reward_credit"),
    ("task", env_task(workers="ray"), "task.env.workers"),          # in one process
])
def test_what_trajectories_do_not_run_on_yet_is_refused_by_name(section, values, field):
    assert field_error({"task": env_task(), section: values})[0] == field


def test_ppo_and_partial_rollout_take_an_env_task_and_turn_credit_needs_ppo():
    cfg = validate_config({"task": env_task(reward_credit="turn"), "algorithm": {"type": "ppo"},
                           "async_policy": {"type": "partial_rollout"}})
    assert cfg.task.env.reward_credit == "turn"
    _, message = field_error({"task": env_task(reward_credit="turn")})
    assert 'use algorithm.type = "ppo"' in message


def test_a_class_that_the_file_lacks_is_a_config_error_when_the_worker_loads_it(tmp_path):
    from engine.envs import env_class

    (tmp_path / "envs.py").write_text("class Other:\n    pass\n")
    cfg = EnvTaskConfig.model_validate({"env": {"class": f"{tmp_path}/envs.py:Mine"}})
    with pytest.raises(ConfigError) as exc:
        env_class(cfg.env)
    field, message = exc.value.errors[0]
    assert field == "task.env.class" and "defines no 'Mine' (it has Other)" in message


# --------------------------------------------------------------------------- the seam


def test_env_calls_run_at_once_each_bounded_by_the_timeout_async_ones_too():
    async def slow_async():
        await asyncio.sleep(0.01)
        return "async"

    def boom():
        raise RuntimeError("tool down")

    # The timeout on a clock the test moves: with the wall clock and 0.5 s, a loaded CI
    # machine once let every call time out, the ones that return at once too.
    now = [100.0]
    second = threading.Event()       # the first call returns once the second one runs
    out = call_all([lambda: second.wait(60), lambda: second.set() or "plain", slow_async,
                    boom], timeout_s=60, clock=lambda: now[0])
    assert [o.status for o in out] == ["ok", "ok", "ok", "error"]
    assert out[0].value is True and out[1].value == "plain" and out[2].value == "async"
    assert out[3].detail == "RuntimeError: tool down"

    gate = threading.Event()
    calls = EnvCalls(0.5, clock=lambda: now[0])
    calls.start(gate.wait)
    now[0] += 0.5                      # its time is up: waited for no longer
    (hung,) = calls.wait()
    gate.set()
    assert (hung.status, hung.start, hung.seconds) == ("timeout", 100.0, 0.5)
    assert hung.detail == "still running after 0.5s"


def test_env_calls_reuse_idle_threads_and_a_hung_call_keeps_only_its_own():
    pool = _CallThreads()      # its own: the process's is shared with whatever else runs

    def one(fn, timeout_s: float = 5.0):
        calls = EnvCalls(timeout_s, threads=pool)
        calls.start(fn)
        return calls.wait()[0]

    gate = threading.Event()
    assert one(gate.wait, timeout_s=0.01).status == "timeout"   # still on its thread
    hung = threading.enumerate()
    threads = [one(threading.current_thread).value for _ in range(50)]
    # one after another: the thread done with a call takes the next (a thread each: 50),
    # and never the one still running the hung call
    assert len({id(t) for t in threads}) == 1
    assert threads[0].daemon and threads[0] not in hung
    gate.set()


def test_the_calculator_answers_a_tool_call_and_scores_the_final_answer():
    env = CalculatorEnv()
    row = env.draw(random.Random(0))
    assert env.reset(row) == [{"role": "user", "content": f"{row['a']}*{row['b']}:"}]
    call = env.step(f"{row['a']}*{row['b']}=")
    assert call.observations == [{"role": "tool", "content": f"{row['answer']}:"}]
    assert call.info["tool_call"] and not call.done
    assert env.step(row["answer"]).reward == 1.0
    assert env.step("12").reward == 0.0
    assert env.step("1*=").reward == -0.1 and env.step("x y").done


def test_the_calculator_writes_its_format_in_the_built_in_model_alphabet():
    from engine.tinymodel import CHARS

    env = CalculatorEnv(demo_tool_frac=1.0)
    row = env.draw(random.Random(3))
    text = env.reset(row)[0]["content"] + "".join(
        m["content"] for m in env.demonstration(row, random.Random(0)))
    assert set(text) <= set(CHARS), set(text) - set(CHARS)


def test_a_warm_start_demonstration_trains_on_the_model_turns_only(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    task = EnvTask(EnvTaskConfig.model_validate(
        {"env": {"args": {"demo_tool_frac": 1.0}}}))
    problem = task.train_problems(0, 1)[0]
    s = demonstration_sample(tok, task, problem)
    a, b, answer = problem.row["a"], problem.row["b"], problem.row["answer"]
    call, obs = f"{a}*{b}=", f"{answer}:"
    assert tok.decode(s.response_ids, skip_special_tokens=True) == call + obs + answer
    assert s.loss_mask == [1] * len(call) + [0] * len(obs) + [1] * (len(answer) + 1)


def test_with_a_chat_template_a_demonstration_is_the_templates_rendering(tmp_path):
    tok = load_tokenizer(build_hf_model(tmp_path / "chatml", "llama"))
    task = EnvTask(EnvTaskConfig.model_validate({"env": {"args": {"demo_tool_frac": 1.0}}}))
    problem = task.train_problems(0, 1)[0]
    s = demonstration_sample(tok, task, problem)
    a, b, answer = problem.row["a"], problem.row["b"], problem.row["answer"]
    conversation = [{"role": "user", "content": f"{a}*{b}:"},
                    {"role": "assistant", "content": f"{a}*{b}="},
                    {"role": "tool", "content": f"{answer}:"},
                    {"role": "assistant", "content": answer}]
    rendered = tok.apply_chat_template(conversation, tokenize=False).removesuffix("\n")
    assert s.prompt_ids + s.response_ids == tok(rendered, add_special_tokens=False)["input_ids"]
    trained = [t for t, m in zip(s.response_ids, s.loss_mask, strict=True) if m]
    assert tok.decode(trained) == f"{a}*{b}={answer}<|im_end|>"


# --------------------------------------------------------------------------- trajectories


class ScriptedEngine:
    """The rollout seam with scripted turns (a fake at the seam): each call answers every
    row with the next text of ``turns``, ending on EOS unless it ends on a stop mark."""

    def __init__(self, tok, turns: list[str], version: int = 3, end: int | None = None):
        self.tok, self.turns, self.version, self.calls = tok, list(turns), version, []
        self.end = tok.eos_token_id if end is None else end     # what an answer ends on

    def weight_version(self) -> int:
        return self.version

    def generate(self, prompts, params, seed, on_complete=None, budgets=None):
        self.calls.append((prompts, budgets))
        text = self.turns.pop(0)
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        out = []
        for cap in budgets:
            stop = text.endswith("=")
            toks = ids + ([] if stop else [self.end])
            out.append(Completion(toks[:cap], [-0.5] * len(toks[:cap]), len(toks) <= cap,
                                  self.version))
        return out


def runner(tok, engine, recorder=None, **env):
    task = EnvTask(EnvTaskConfig.model_validate({"eval_size": 8, "env": env}))
    return task, TrajectoryRunner(engine, task, tok, SamplingParams(max_new_tokens=12),
                                  recorder or SpanRecorder(["cpu:0"]))


def test_a_tool_call_turn_gets_the_observation_appended_masked_then_the_answer(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    rec = SpanRecorder(["cpu:0"])
    task, run = runner(tok, None, rec)
    problem = task.train_problems(0, 1)[0]
    a, b, answer = problem.row["a"], problem.row["b"], problem.row["answer"]
    run.engine = ScriptedEngine(tok, [f"{a}*{b}=", answer])
    trajs = run.run([problem], group_size=2, seed=0, step=5)
    (s, _) = run.samples(trajs)
    call, obs = f"{a}*{b}=", f"{answer}:"
    assert s.text == call + obs + answer and s.reward == 1.0 and s.finished
    assert s.loss_mask == [1] * len(call) + [0] * len(obs) + [1] * (len(answer) + 1)
    assert s.behaviour_logprobs[len(call):len(call) + len(obs)] == [0.0] * len(obs)
    assert s.env.turns == 2 and s.env.tool_calls == 1 and len(s.env.step_s) == 3
    # the second turn continued the running context: prompt, the call, the observation
    second = run.engine.calls[1][0][0]
    assert tok.decode(second, skip_special_tokens=True) == problem.prompt + call + obs
    assert tok.convert_tokens_to_ids("=") in run._turn_params(run.params).stop_token_ids
    closed, _ = rec.drain()
    assert [x.phase for x in closed].count("env") == 2 * 3     # reset + 2 steps, 2 rows
    assert {x.step for x in closed} == {5}


def test_with_a_chat_template_the_context_is_the_templates_rendering_of_the_conversation(
        tmp_path):
    tok = load_tokenizer(build_hf_model(tmp_path / "chatml", "llama"))
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    task, run = runner(tok, None)
    problem = task.train_problems(0, 1)[0]
    a, b, answer = problem.row["a"], problem.row["b"], problem.row["answer"]
    call = f"{a}*{b}="                   # ends on the env's stop: the template closes it
    run.engine = ScriptedEngine(tok, [call, answer], end=eot)    # the answer, on <|im_end|>
    (t,) = run.run([problem], group_size=1, seed=0, step=0)
    assert (t.reward, t.finished, t.trace.turns) == (1.0, True, 2)
    conversation = [{"role": "user", "content": f"{a}*{b}:"},
                    {"role": "assistant", "content": call},
                    {"role": "tool", "content": f"{answer}:"},
                    {"role": "assistant", "content": answer}]
    # the model's last turn ends on its own <|im_end|>; the template writes "\n" after it
    rendered = tok.apply_chat_template(conversation, tokenize=False).removesuffix("\n")
    assert t.prompt_ids + t.response_ids == tok(rendered, add_special_tokens=False)["input_ids"]
    assert tok.decode(t.prompt_ids) == tok.apply_chat_template(
        conversation[:1], tokenize=False, add_generation_prompt=True)
    # trained: the model's turns (its <|im_end|> included); read: the template's close of
    # the tool call, the tool message and the next generation prompt
    n_call, n_answer = len(tok(call)["input_ids"]), len(tok(answer)["input_ids"]) + 1
    assert t.mask[:n_call] == [1] * n_call and t.mask[-n_answer:] == [1] * n_answer
    between = t.response_ids[n_call:-n_answer]
    assert tok.decode(between) == (f"<|im_end|>\n<|im_start|>tool\n{answer}:<|im_end|>\n"
                                   "<|im_start|>assistant\n")
    assert t.mask[n_call:-n_answer] == [0] * len(between)
    assert t.logprobs[n_call:-n_answer] == [0.0] * len(between)


def test_without_a_chat_template_the_turns_are_the_contents_concatenated(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    assert not getattr(tok, "chat_template", None)
    turns = TurnTemplate(tok)
    opening = [{"role": "user", "content": "12*34:"}]
    assert turns.opening(opening) == encode_prompt(tok, "12*34:")
    tool = [{"role": "tool", "content": "408:"}]
    assert turns.after(tok("12*34=")["input_ids"], tool) == tok(
        "408:", add_special_tokens=False)["input_ids"]


class SyncedBetweenTurns(ScriptedEngine):
    """Scripted turns whose weights move on after each call (a sync between turns)."""

    def generate(self, prompts, params, seed, on_complete=None, budgets=None):
        out = super().generate(prompts, params, seed, on_complete, budgets)
        self.version += 1
        return out


def test_the_inspector_gets_a_trajectory_turn_by_turn_with_versions_and_rewards(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    task, run = runner(tok, None)
    problem = task.train_problems(0, 1)[0]
    a, b, answer = problem.row["a"], problem.row["b"], problem.row["answer"]
    run.engine = SyncedBetweenTurns(tok, [f"{a}*{b}=", answer], version=3)
    (s,) = run.samples(run.run([problem], group_size=1, seed=0, step=5))
    call, obs = len(f"{a}*{b}="), len(f"{answer}:")
    n = len(s.response_ids)
    learner = [[-0.25] * n]
    (r,) = samples_event(5, [s], [0], [1], learner, lambda t: tok.decode([t])).samples
    assert r.turns == [TrajectoryTurn("model", 0, call, version=3, reward=0.0),
                       TrajectoryTurn("env", call, call + obs),
                       TrajectoryTurn("model", call + obs, n, version=4, reward=1.0)]
    assert (r.version, r.last_version) == (3, 4)
    # an observation was not sampled: no logprob on either side, so no gap to shade
    assert r.behaviour_logprobs[call:call + obs] == [None] * obs
    assert r.learner_logprobs[call:call + obs] == [None] * obs
    assert None not in r.behaviour_logprobs[:call] + r.behaviour_logprobs[call + obs:]
    # single-turn rollouts carry no turns
    s.loss_mask = None
    assert samples_event(5, [s], [0], [1], learner, str).samples[0].turns == []


def test_the_trajectory_token_budget_cuts_the_observation_and_ends_it_unfinished(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    task, run = runner(tok, None, max_tokens=8)
    problem = task.train_problems(0, 1)[0]
    call = f"{problem.row['a']}*{problem.row['b']}="                 # 6 tokens
    run.engine = ScriptedEngine(tok, [call])
    (t,) = run.run([problem], group_size=1, seed=0, step=0)
    assert len(t.response_ids) == 8 and t.mask == [1] * 6 + [0] * 2
    assert t.reason == "max_tokens" and not t.finished and t.trace.turns == 1


def test_a_turn_cut_by_its_budget_ends_the_trajectory_without_a_step(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    task, run = runner(tok, ScriptedEngine(tok, ["12345678901234567"]))
    (t,) = run.run(task.train_problems(0, 1), group_size=1, seed=0, step=0)
    assert t.reason == "truncated" and len(t.response_ids) == 12
    assert len(t.trace.step_s) == 1                                # the reset only


def test_max_turns_ends_a_trajectory_that_keeps_calling_tools(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    task, run = runner(tok, ScriptedEngine(tok, ["1*2="] * 2), max_turns=2)
    (t,) = run.run(task.train_problems(0, 1), group_size=1, seed=0, step=0)
    assert t.reason == "max_turns" and t.trace.turns == 2 and t.trace.tool_calls == 2


def user_env_file(tmp_path, body: str):
    path = tmp_path / "my_env.py"
    path.write_text(body)
    return f"{path}:EchoEnv"


ECHO_ENV = '''
import asyncio


class EchoEnv:
    """Two turns: the first is answered with "ok:", the second ends it (reward 1 when it
    says "a"). Its step is async, as an HTTP tool's would be."""
    stop = ()
    made = closes = 0

    def __init__(self, hang_at=-1, fail_at=-1, fail_reset=False, fail_close=False):
        self.turn, self.hang_at, self.fail_at = 0, hang_at, fail_at
        self.fail_close = fail_close
        EchoEnv.made += 1
        # the task's own instance (the first: it renders the prompts) resets fine
        self.fail_reset = fail_reset and EchoEnv.made > 1

    def draw(self, rng):
        return {"word": rng.choice("abcdefgh") * rng.randint(1, 4)}

    def reset(self, row):
        if self.fail_reset:
            raise ConnectionError("no tool server")
        return [{"role": "user", "content": row["word"] + ":"}]

    def close(self):
        EchoEnv.closes += 1
        if self.fail_close:
            raise OSError("socket already closed")

    async def step(self, text):
        self.turn += 1
        if self.turn == self.fail_at:
            raise ValueError("tool crashed")
        if self.turn == self.hang_at:
            await asyncio.sleep(30)
        if self.turn == 1:
            return ([{"role": "tool", "content": "ok:"}], 0.0, False, {"tool_call": True})
        return ([], 1.0 if "a" in text else 0.0, True, {})
'''


def echo_run(tok, spec: str, engine, log=None, **env) -> tuple[EnvTask, TrajectoryRunner]:
    """EchoEnv from ``spec`` with task.env settings ``env`` (its args among them), run on
    ``engine``."""
    task = EnvTask(EnvTaskConfig.model_validate({"eval_size": 8,
                                                 "env": {"class": spec, **env}}))
    return task, TrajectoryRunner(engine, task, tok, SamplingParams(max_new_tokens=8),
                                  SpanRecorder(["cpu:0"]), log=log)


def test_an_environment_that_raises_or_hangs_ends_its_trajectory_and_is_counted(
        tiny_dir, tmp_path):
    tok = load_tokenizer(tiny_dir)
    spec = user_env_file(tmp_path, ECHO_ENV)
    said = []
    for args, reason in (({"fail_at": 1}, "env_error"), ({"hang_at": 2}, "env_timeout")):
        task, run = echo_run(tok, spec, ScriptedEngine(tok, ["aa", "ab"]),
                             log=lambda m, level: said.append(m), args=args,
                             step_timeout_s=0.2)
        t0 = time.monotonic()
        (s,) = run.samples(run.run(task.train_problems(0, 1), 1, seed=0, step=0))
        assert s.reason == reason and not s.finished
        assert (s.env.errors, s.env.timeouts) == ((1, 0) if reason == "env_error" else (0, 1))
        assert time.monotonic() - t0 < 10        # not the 30 s the hang would take
    assert said == [f"environment {spec!r} raised ValueError: tool crashed"]


class Sequential:
    """A rollout engine that calls no on_complete (as one may): every step starts after
    the generate call, none overlaps generation."""

    def __init__(self, inner):
        self.inner = inner

    def weight_version(self) -> int:
        return self.inner.weight_version()

    def generate(self, prompts, params, seed, on_complete=None, budgets=None):
        return self.inner.generate(prompts, params, seed, budgets=budgets)


DIGIT_ENV = '''
class DigitEnv:
    """A turn ends at the first digit the model writes (the untrained tiny model writes
    one soon, after a varying number of tokens); each step answers "ok:" and pays the
    turn's length, the third ends it."""
    stop = tuple("0123456789")

    def __init__(self):
        self.turn = 0

    def draw(self, rng):
        return {"word": rng.choice("abcdefgh") * rng.randint(1, 4)}

    def reset(self, row):
        return [{"role": "user", "content": row["word"] + ":"}]

    def step(self, text):
        self.turn += 1
        return ([{"role": "tool", "content": "ok:"}], float(len(text)), self.turn == 3, {})
'''


def test_a_turns_env_step_starts_while_the_batch_decodes_and_changes_no_trajectory(
        tiny_dir, tmp_path):
    tok = load_tokenizer(tiny_dir)
    engine = TorchRollout.from_pretrained(tiny_dir)
    spec = user_env_file(tmp_path, DIGIT_ENV).replace(":EchoEnv", ":DigitEnv")
    got = []
    for eng in (engine, Sequential(engine)):
        task, run = echo_run(tok, spec, eng, max_turns=3)
        rec = run.rec
        trajs = run.run(task.train_problems(0, 3), group_size=2, seed=11, step=0)
        got.append(([(t.response_ids, t.logprobs, t.mask, t.reward, t.reason, t.trace.turns,
                      t.trace.tool_calls) for t in trajs], rec.drain()[0]))
    (overlapped, spans), (sequential, sequential_spans) = got
    assert overlapped == sequential
    assert len(spans) == len(sequential_spans)
    assert sum(t[5] for t in overlapped) > len(overlapped)      # some went on to a 2nd turn
    rollouts = [s for s in spans if s.phase == "rollout"]
    envs = [s for s in spans if s.phase == "env"]
    # an early finisher's step began inside the generate call that produced its turn
    assert any(r.start < e.start < r.end for r in rollouts for e in envs)
    assert not any(r.start < e.start < r.end for r in rollouts
                   for e in sequential_spans if e.phase == "env")


def test_a_reset_that_raises_ends_the_trajectory_before_any_turn_at_the_served_version(
        tiny_dir, tmp_path):
    tok = load_tokenizer(tiny_dir)
    engine = ScriptedEngine(tok, [], version=7)
    task, run = echo_run(tok, user_env_file(tmp_path, ECHO_ENV), engine,
                         args={"fail_reset": True})
    samples = run.samples(run.run(task.train_problems(0, 2), 1, seed=0, step=0))
    assert [(s.reason, s.version, s.env.errors, s.response_ids) for s in samples] == \
        [("env_error", 7, 1, [])] * 2
    assert engine.calls == []                                   # nothing was generated
    assert pack(samples, tok.pad_token_id).response_mask.sum() == 0


def test_a_close_that_raises_is_counted_and_leaves_the_finished_trajectory_be(
        tiny_dir, tmp_path):
    tok = load_tokenizer(tiny_dir)
    task, run = echo_run(tok, user_env_file(tmp_path, ECHO_ENV),
                         ScriptedEngine(tok, ["aa", "ab"]), args={"fail_close": True})
    (s,) = run.samples(run.run(task.train_problems(0, 1), 1, seed=0, step=0))
    assert (s.finished, s.reward, s.reason, s.env.errors) == (True, 1.0, "done", 1)


def carried(task: EnvTask, version: int) -> PartialGroup:
    """A group of two trajectories carried unfinished, generated at ``version``."""
    (problem,) = task.train_problems(0, 1)
    return PartialGroup(problem, [Trajectory(problem, task.new_env(), 0, versions=[version])
                                  for _ in range(2)], recycled=1)


def test_carried_trajectories_dropped_stale_or_left_at_the_end_have_their_env_closed(
        tmp_path):
    spec = user_env_file(tmp_path, ECHO_ENV)
    for args, errors in (({}, 0), ({"fail_close": True}, 2)):
        task = EnvTask(EnvTaskConfig.model_validate({"eval_size": 8, "env": {
            "class": spec, "args": args}}))
        exp = Experience([], task, ExperienceBuffer(), 2, 2, seed=0)
        stale, fresh = carried(task, 1), carried(task, 4)
        assert exp.keep_fresh([stale, fresh], trains_at=5, eta=1) == [fresh]
        assert all(t.closed for t in stale.rows) and not any(t.closed for t in fresh.rows)
        assert task.env_cls.closes == 2
        # a failed close is the step's env error: nothing else would count it
        assert env_metrics([Sample(Problem("p", "a"), [1], [2], [0.0], True, 0, 0,
                                   env=EnvTrace())],
                           exp.take_close_faults())[M.ENV_ERRORS] == errors
        assert exp.take_close_faults() == EnvTrace()
        policy = PartialRolloutPolicy(exp, PartialRolloutPolicyConfig())
        policy.carry = [fresh]
        policy.close()                                    # the run ends with it carried
        assert task.env_cls.closes == 4 and all(t.closed for t in fresh.rows)
        exp.close_trajectories([stale, fresh])            # each closed once
        assert task.env_cls.closes == 4
        streaming = StreamingPolicy(exp, "fully_async", 0, False, 2, 0, over_provision=2.0)
        streaming.carry = [[later := carried(task, 4)]]   # a worker's carried groups
        streaming.close()
        assert task.env_cls.closes == 6 and all(t.closed for t in later.rows)
        task.env_cls.closes = 0


def test_a_user_environment_class_from_a_file_runs_from_a_config(tmp_path, model_cache):
    from engine.api import run_local

    spec = user_env_file(tmp_path, ECHO_ENV)
    cfg = validate_config({
        "name": "echo", "steps": 2, "task": env_task(**{"class": spec, "max_tokens": 16}),
        "warm_start": {"steps": 0}, "algorithm": {"group_size": 2, "minibatches": 1},
        "rollout": {"prompts_per_step": 2, "max_new_tokens": 4},
        "telemetry": {"eval_samples": 1}})
    summary = run_local(cfg, tmp_path / "run")
    assert summary.status == "succeeded" and summary.steps_done == 2
    m = summary.last_metrics
    assert m["env/turns_max"] >= 1 and m["env/errors"] == 0 and m["time/env_s"] > 0
    assert "eval/tool_call_frac" in summary.eval_after
    # a turn after the first continued its context from the torch sampler's prefix cache
    assert (m[M.ROLLOUT_PREFIX_HIT_FRAC] > 0) == (m["env/turns_max"] > 1), m


def test_the_held_out_evals_turns_stay_out_of_the_steps_prefix_hit_frac(tiny_dir):
    """rollout/prefix_hit_frac is the step's: the held-out eval, run between steps on the
    same sampler, counts its turns there too, and the worker leaves them out; what the
    step's trajectories fed before it stays for the step's read."""
    from engine.orchestration.evaluation import evaluate
    from engine.orchestration.workers import RolloutWorker

    from .preset_runs import CONFIGS_DIR

    cfg = load_config(CONFIGS_DIR / "calculator_env.toml")
    cfg = cfg.model_copy(update={"task": cfg.task.model_copy(update={"eval_size": 8})})
    worker = RolloutWorker(cfg, tiny_dir, tiny_dir, ["cpu:0"])
    evaluate(worker.engine, worker.task, worker.tok, 1.0, cfg.rollout.max_new_tokens,
             seed=0, samples=1)
    assert worker.engine.prefix_stats()[1] > 0          # the engine counts eval turns
    worker.produce(1, worker.task.train_problems(0, 2), seed=0)
    step_fed = tuple(worker.engine._prefix_tokens)       # the step's, not read yet
    worker.evaluate(1.0, seed=0, samples=1)
    assert step_fed[1] > 0 and worker.prefix_stats() == step_fed
    assert worker.prefix_stats() == (0, 0)
