"""Training on trajectories (task.type = "env"): the loss mask over the model's own tokens
(observations get no gradient and stay out of the logprob gap; PPO's critic alike; packed
= padded), env/* telemetry and the env faults' alerts. The config, the environment seam
and the trajectories themselves: test_envs.py."""


import pytest
import torch

from engine.config import GrpoConfig, LearnerConfig, validate_config
from engine.experience import EnvTrace, Sample
from engine.learner.batch import pack, response_logprobs
from engine.learner.learner import Learner
from engine.model import load_policy, load_tokenizer
from engine.tasks import Problem
from engine.telemetry.recorder import SpanRecorder
from engine.telemetry.spans import phase_metrics
from engine.telemetry.step_metrics import env_metrics

from .test_envs import env_task, field_error

# --------------------------------------------------------------------------- the loss mask


def trajectory_batch(tok, policy):
    """Two trajectories: a model turn, an observation, a model turn. Behaviour logprobs
    are the policy's own on the model's tokens and nonsense (-40) on the observations."""
    samples = []
    for prompt, turns in (("12*34:", ["12*34=", "408:", "408"]),
                          ("7*8:", ["56"])):
        ids, mask = [], []
        for k, text in enumerate(turns):
            piece = tok(text, add_special_tokens=False)["input_ids"]
            ids += piece
            mask += [0 if k % 2 else 1] * len(piece)
        ids, mask = ids + [tok.eos_token_id], mask + [1]
        samples.append(Sample(Problem(prompt, ""), tok(prompt)["input_ids"], ids,
                              [0.0] * len(ids), True, 0, 0, loss_mask=mask,
                              advantage=1.0 if not samples else -1.0))
    full = pack([Sample(s.problem, s.prompt_ids, s.response_ids, s.behaviour_logprobs,
                        True, 0, 0) for s in samples], tok.pad_token_id)
    with torch.no_grad():
        own, _ = response_logprobs(policy, full, temperature=1.0)
    for i, s in enumerate(samples):
        s.behaviour_logprobs = [float(own[i, t]) if m else -40.0
                                for t, m in enumerate(s.loss_mask)]
    return samples


def test_observation_tokens_get_exactly_zero_gradient_and_are_left_out_of_the_gap(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    policy = load_policy(tiny_dir)
    samples = trajectory_batch(tok, policy)
    learner = Learner(policy, GrpoConfig(minibatches=1, kl_coef=0.1), 1.0, seed=0,
                      reference=load_policy(tiny_dir), setup=LearnerConfig(packing=False))
    captured = {}

    def keep(_module, _inputs, output):
        output.retain_grad()
        captured["hidden"] = output

    handle = learner.policy.model.norm.register_forward_hook(keep)
    batch = pack(samples, tok.pad_token_id)
    m = learner.update(batch)
    handle.remove()
    grad = captured["hidden"].grad                                        # (B, P+R, H)
    P = batch.prompt_len
    for i, s in enumerate(samples):
        for t, trained in enumerate(s.loss_mask):
            at = grad[i, P + t - 1]                       # the output that predicts token t
            if trained:
                assert at.abs().sum() > 0, (i, t)
            else:
                assert torch.equal(at, torch.zeros_like(at)), (i, t)
    # -40 behaviour logprobs sit on every observation token: none reaches the gap
    assert m["logprob_gap/max"] < 1e-4 and m["tis/clip_frac"] == 0.0
    assert m["learner/kl_ref"] == pytest.approx(0.0, abs=1e-6)


def test_ppo_on_trajectories_trains_neither_actor_nor_critic_on_observations(tiny_dir):
    """PPO's critic reads the observations as context, but its values there are no
    steps: advantages and returns are 0 on them and the value loss sends them no
    gradient; the actor's update then trains on the model's turns only."""
    from engine.config import PpoConfig
    from engine.learner.ppo import PpoLearner
    from engine.model import load_critic

    tok = load_tokenizer(tiny_dir)
    samples = trajectory_batch(tok, load_policy(tiny_dir))
    for s, r in zip(samples, (1.0, 0.0), strict=True):
        s.reward = r
    learner = PpoLearner(load_policy(tiny_dir), load_critic(tiny_dir),
                         PpoConfig(minibatches=1, critic={"lr": 1e-2}), 1.0, seed=0,
                         setup=LearnerConfig(packing=False))
    captured = {}

    def keep(_module, _inputs, output):
        if output.requires_grad:                         # a training forward, not old values
            output.retain_grad()
            captured.setdefault("hidden", []).append(output)

    batch = pack(samples, tok.pad_token_id)
    learner.update_critic(batch)                        # a first value step: values move
    handle = learner.critic.model.model.norm.register_forward_hook(keep)
    adv, _ = learner.update_critic(batch)
    handle.remove()
    grad = next(h.grad for h in captured["hidden"] if h.grad is not None)   # (B, P+R, H)
    P, obs = batch.prompt_len, batch.response_mask == 0
    assert bool((adv[obs] == 0).all()) and bool((adv[~obs] != 0).any())
    for i, s in enumerate(samples):
        for t, trained in enumerate(s.loss_mask):
            at = grad[i, P + t - 1]             # the output V(s_t) of response token t reads
            assert (at.abs().sum() > 0) == bool(trained), (i, t)
    assert learner.update(batch, adv)["learner/loss"] != 0.0


def test_packed_and_padded_layouts_agree_on_a_trajectory_with_observations(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    policy = load_policy(tiny_dir).eval()
    batch = pack(trajectory_batch(tok, policy), tok.pad_token_id)
    with torch.no_grad():
        padded, _ = response_logprobs(policy, batch, 1.0)
        packed, _ = response_logprobs(policy, batch, 1.0, packed=True)
    assert torch.allclose(padded, packed, atol=1e-5)
    assert bool((padded[batch.response_mask == 0] == 0).all())


# --------------------------------------------------------------------------- telemetry


def test_env_metrics_summarize_the_trajectories_and_are_absent_without_an_env():
    def sample(trace):
        return Sample(Problem("", ""), [1], [2], [0.0], True, 0, 0, env=trace)

    traces = [EnvTrace(turns=1, step_s=[0.1, 0.2]), EnvTrace(turns=3, step_s=[0.3],
                                                              errors=1, tool_calls=2),
              EnvTrace(turns=2, timeouts=1)]
    m = env_metrics([sample(t) for t in traces])
    assert m["env/turns_mean"] == 2.0 and m["env/turns_max"] == 3.0
    assert m["env/step_s_p50"] == pytest.approx(0.2)
    assert (m["env/errors"], m["env/timeouts"], m["env/tool_calls"]) == (1.0, 1.0, 2.0)
    assert env_metrics([sample(None)]) == {}


def test_env_spans_count_as_busy_time_in_the_bubble():
    rec = SpanRecorder(["cpu:0"])
    rec.record("env", 1.0, 3.0, step=0, version=0)
    closed, _ = rec.drain()
    m = phase_metrics(closed, ["cpu:0"], 0.0, 4.0)
    assert m["time/env_s"] == 2.0 and m["bubble"] == pytest.approx(0.5)
    assert m["device/utilization/cpu:0/env"] == pytest.approx(0.5)



# --------------------------------------------------------------------------- faults


def test_env_faults_need_an_environment():
    assert field_error({"faults": {"env_error": {}}})[0] == "faults.env_error"


@pytest.mark.parametrize("fault, kind, words", [
    ({"env_error": {"from_step": 2}}, "EnvErrors", "The environment raised in"),
    ({"slow_env": {"from_step": 2, "seconds": 2.0}}, "EnvHang",
     "ran past task.env.step_timeout_s"),
])
def test_an_env_fault_raises_its_alert_within_3_steps_of_its_onset(tmp_path, model_cache,
                                                                     fault, kind, words):
    from engine.api import run_local
    from jobs.alerts.history import RunFacts

    from .alert_watch import AlertWatch

    cfg = validate_config({
        # A healthy call must not reach the timeout on a loaded machine: at 0.2 s one did
        # in CI (step 1 "ran past" it, before the fault's onset).
        "name": "f", "steps": 4, "task": env_task(max_tokens=16, step_timeout_s=1.0),
        "warm_start": {"steps": 0}, "algorithm": {"group_size": 2, "minibatches": 1},
        "rollout": {"prompts_per_step": 2, "max_new_tokens": 4},
        "telemetry": {"eval_samples": 1}, "faults": fault})
    watch = AlertWatch(RunFacts.from_config(cfg, "running"))
    run_local(cfg, tmp_path, sink=watch)
    hit = watch.first(kind)
    assert hit is not None, sorted(watch.kinds())
    step, finding = hit
    assert 2 <= step <= 4 and words in finding.cause, (step, finding.cause)
    assert all(s >= 2 for s, f in watch.fired if f.kind == kind)
