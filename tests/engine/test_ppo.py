"""PPO's pieces against hand-computed numbers, and its learner and config on the tiny model.

The GAE example (gamma 0.9), two sequences, the second one token shorter:

    values   seq 0: [0.5, 0.2, 0.4]     seq 1: [0.1, 0.3, (pad)]
    rewards  seq 0: [0,   0,   1  ]     seq 1: [0,  -1,  (pad)]     (on the last token)

    lam = 0 (one-step TD errors; the last token is terminal, no value after it)
        seq 0: 0 + .9*.2 - .5 = -0.32    0 + .9*.4 - .2 = 0.16    1 - .4 = 0.6
        seq 1: 0 + .9*.3 - .1 =  0.17   -1 - .3 = -1.3
    lam = 1 (discounted return minus value)
        seq 0: returns [.81, .9, 1] -> [0.31, 0.7, 0.6]
        seq 1: returns [-.9, -1]    -> [-1.0, -1.3]
"""

import pytest
import torch

from engine.config import ConfigError, PpoConfig, validate_config
from engine.experience import Sample
from engine.learner.batch import pack, response_values
from engine.learner.losses import (
    clipped_value_loss,
    explained_variance,
    gae,
    masked_whiten,
    terminal_rewards,
)
from engine.learner.ppo import PpoLearner, critic_source
from engine.model import load_critic, load_policy, load_tokenizer
from engine.tasks import Problem

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
VALUES = torch.tensor([[0.5, 0.2, 0.4], [0.1, 0.3, 7.0]])     # 7.0: pad, never read
REWARDS = torch.tensor([1.0, -1.0])


def test_the_sequence_reward_sits_on_the_last_response_token():
    assert terminal_rewards(REWARDS, MASK).tolist() == [[0.0, 0.0, 1.0], [0.0, -1.0, 0.0]]


@pytest.mark.parametrize(("lam", "adv", "returns"), [
    (0.0, [[-0.32, 0.16, 0.6], [0.17, -1.3, 0.0]], [[0.18, 0.36, 1.0], [0.27, -1.0, 0.0]]),
    (1.0, [[0.31, 0.7, 0.6], [-1.0, -1.3, 0.0]], [[0.81, 0.9, 1.0], [-0.9, -1.0, 0.0]]),
])
def test_gae_matches_the_hand_computed_example(lam, adv, returns):
    a, g = gae(terminal_rewards(REWARDS, MASK), VALUES, MASK, gamma=0.9, lam=lam)
    assert torch.allclose(a, torch.tensor(adv), atol=1e-6), a
    assert torch.allclose(g, torch.tensor(returns), atol=1e-6), g


def test_gae_between_the_extremes_mixes_them_by_lambda():
    # A_0 = d_0 + g*lam*d_1 + (g*lam)^2*d_2 with the lam = 0 deltas of sequence 0.
    a, _ = gae(terminal_rewards(REWARDS, MASK), VALUES, MASK, gamma=0.9, lam=0.5)
    assert float(a[0, 0]) == pytest.approx(-0.32 + 0.45 * 0.16 + 0.45 ** 2 * 0.6)


def test_gae_passes_over_a_trajectorys_observations_as_if_they_were_not_there():
    """A trajectory: two model tokens, an observation of two (mask 0, values there are
    nonsense), one model token, then pad; its reward on its last sampled token. GAE
    equals the contiguous sequence's with the observation cut out (veRL's GAE)."""
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.2, 9.0, -9.0, 0.4, 5.0]])
    rewards = terminal_rewards(torch.tensor([1.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]]
    a, g = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    plain, plain_g = gae(terminal_rewards(REWARDS[:1], MASK[:1]), VALUES[:1], MASK[:1],
                         gamma=0.9, lam=0.5)
    keep = mask[0].bool()
    assert torch.allclose(a[0, keep], plain[0]) and torch.allclose(g[0, keep], plain_g[0])
    assert a[0, ~keep].abs().sum() == 0 and g[0, ~keep].abs().sum() == 0


def test_turn_credit_places_each_turns_reward_and_the_rest_at_the_end():
    s = Sample(Problem("1:", ""), [1], [5, 6, 7, 8, 9], [0.0] * 5, True, 0, 0, reward=0.9,
               shaping=-0.1, loss_mask=[1, 1, 0, 1, 0], credit=[(1, -0.1), (3, 1.0)])
    plain = Sample(Problem("1:", ""), [1], [5, 6], [0.0] * 2, True, 0, 0, reward=1.0)
    batch = pack([s, plain], pad_id=0)
    # the shaping (-0.1) sits on the last sampled token, beside that turn's reward
    assert torch.allclose(batch.token_rewards, torch.tensor(
        [[0.0, -0.1, 0.0, 1.0 - 0.1, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0]]))
    assert batch.token_rewards.sum(-1).tolist() == pytest.approx([0.8, 1.0])


def test_clipped_value_loss_takes_the_worse_of_the_plain_and_the_clipped_value():
    # token 0: V moved 0.5 -> 1.0, clipped to 0.7: (0.7-2)^2 = 1.69 > (1-2)^2 = 1
    # token 1: V moved 0.5 -> 0.0, clipped to 0.3: (0-0.4)^2 = 0.16 > (0.3-0.4)^2 = 0.01
    loss, clipped = clipped_value_loss(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]),
                                       torch.tensor([2.0, 0.4]), clip_eps=0.2)
    assert loss.tolist() == pytest.approx([0.5 * 1.69, 0.5 * 0.16])
    assert clipped.tolist() == [True, False]


def test_whitened_advantages_have_zero_mean_and_unit_std_on_the_response():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
    w = masked_whiten(x, MASK)
    real = w[MASK.bool()]
    assert float(real.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(real.std()) == pytest.approx(1.0, abs=1e-4)
    assert float(w[1, 2]) == 0.0


def test_explained_variance_is_one_for_a_perfect_critic_and_zero_for_the_mean():
    returns = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
    assert explained_variance(returns, returns, MASK) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 3.0), returns, MASK) == pytest.approx(0.0)


# --------------------------------------------------------------------------- the learner

@pytest.fixture(scope="module")
def scored_batch(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    prompts = [tok(p)["input_ids"] for p in ["12+3=", "4*5=", "7-2="] for _ in range(2)]
    responses = [tok(r, add_special_tokens=False)["input_ids"]
                 for r in ["15", "1", "20", "21", "5", "55"]]
    samples = [Sample(Problem("", ""), p, r, [-1.0] * len(r), True, 0, i // 2,
                      reward=float(i % 2 == 0))
               for i, (p, r) in enumerate(zip(prompts, responses, strict=True))]
    return pack(samples, tok.pad_token_id)


def test_a_critic_from_the_policy_starts_at_zero_and_learns_the_returns(tiny_dir, scored_batch):
    cfg = PpoConfig(minibatches=1, critic={"lr": 1e-3})
    learner = PpoLearner(load_policy(tiny_dir), load_critic(tiny_dir), cfg, 1.0, seed=0)
    assert float(learner.critic.old_values(scored_batch).abs().max()) == 0.0
    losses = [learner.update_critic(scored_batch)[1]["critic/value_loss"] for _ in range(10)]
    assert losses[-1] < 0.6 * losses[0]        # measured: 0.240 -> 0.106
    after = learner.update_critic(scored_batch)[1]
    assert after["critic/explained_variance"] > 0.0


def test_the_actor_trains_on_per_token_gae_advantages(tiny_dir, scored_batch):
    cfg = PpoConfig(minibatches=1, whiten_advantages=False, lam=1.0)
    learner = PpoLearner(load_policy(tiny_dir), load_critic(tiny_dir), cfg, 1.0, seed=0)
    adv, metrics = learner.update_critic(scored_batch)
    # A zero critic and lam = gamma = 1: every token's advantage is its sequence's reward.
    expected = scored_batch.rewards[:, None] * scored_batch.response_mask
    assert torch.equal(adv, expected)
    assert metrics["critic/value_mean"] == 0.0
    before = {n: p.detach().clone() for n, p in learner.policy.named_parameters()}
    m = learner.update(scored_batch, adv)
    assert m["learner/loss"] != 0.0 and learner.version == 1
    assert any(not torch.equal(before[n], p) for n, p in learner.policy.named_parameters())


def test_values_are_the_same_packed_and_padded(tiny_dir, scored_batch):
    critic = load_critic(tiny_dir)
    torch.nn.init.normal_(critic.score.weight)
    with torch.no_grad():
        padded = response_values(critic, scored_batch)
        packed = response_values(critic, scored_batch, packed=True)
    assert torch.allclose(padded, packed, atol=1e-5)
    assert float(padded.abs().sum()) > 0 and float((padded * (1 - scored_batch.response_mask))
                                                   .abs().sum()) == 0.0


def test_a_checkpoint_without_a_critic_needs_critic_path(tmp_path, tiny_dir):
    ckpt = tmp_path / "step_000004"
    ckpt.mkdir()
    with pytest.raises(ValueError, match="algorithm.critic.path"):
        critic_source(PpoConfig(), tiny_dir, ckpt)
    assert critic_source(PpoConfig(critic={"path": str(tiny_dir)}), tiny_dir, ckpt) == tiny_dir
    (ckpt / "critic").mkdir()
    assert critic_source(PpoConfig(), tiny_dir, ckpt) == ckpt / "critic"
    assert critic_source(PpoConfig(), tiny_dir, None) == tiny_dir


# --------------------------------------------------------------------------- config

def errors_of(data) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as exc:
        validate_config(data)
    return exc.value.errors


def test_ppo_is_an_algorithm_type_with_its_own_fields():
    cfg = validate_config({"algorithm": {"type": "ppo", "gamma": 0.99, "lam": 0.9,
                                         "critic": {"lr": 5e-5}}})
    assert isinstance(cfg.algorithm, PpoConfig)
    assert (cfg.algorithm.gamma, cfg.algorithm.lam, cfg.algorithm.critic.lr) == (0.99, 0.9, 5e-5)


def test_grpo_fields_are_not_ppo_fields_and_back():
    [(path, msg)] = errors_of({"algorithm": {"type": "ppo", "adv_estimator": "rloo"}})
    assert path == "algorithm.adv_estimator" and "unknown key" in msg and "lam" in msg
    [(path, _)] = errors_of({"algorithm": {"lam": 0.9}})
    assert path == "algorithm.lam"


def test_lambda_out_of_range_names_the_field():
    [(path, msg)] = errors_of({"algorithm": {"type": "ppo", "lam": 1.5}})
    assert path == "algorithm.lam" and "less than or equal to 1" in msg


def test_a_missing_critic_path_names_the_field_and_the_fix(tmp_path):
    [(path, msg)] = errors_of({"algorithm": {"type": "ppo",
                                             "critic": {"path": str(tmp_path / "nope")}}})
    assert path == "algorithm.critic.path" and "config.json" in msg


def test_a_sharded_learner_is_refused_for_ppo():
    [(path, msg)] = errors_of({"algorithm": {"type": "ppo"},
                               "placement": {"type": "disaggregated", "learner_devices": 2},
                               "weight_sync": {"type": "object_store"}})
    assert "placement.learner_devices" in msg and "learner_devices = 1" in msg


RAY_PPO = {"algorithm": {"type": "ppo"}, "weight_sync": {"type": "shm"},
           "placement": {"type": "colocated", "ray": True, "critic_devices": 1}}


def test_a_critic_on_its_own_bundle_is_a_ray_placement_of_a_ppo_run():
    assert validate_config(RAY_PPO).placement.critic_devices == 1
    [(path, msg)] = errors_of({**RAY_PPO, "algorithm": {"type": "grpo"}})
    assert path == "placement.critic_devices" and 'algorithm.type = "ppo"' in msg
    [(path, msg)] = errors_of({**RAY_PPO, "weight_sync": {"type": "in_place"},
                               "placement": {"type": "colocated", "critic_devices": 1}})
    assert path == "placement.critic_devices" and "placement.ray = true" in msg
    [(path, msg)] = errors_of({**RAY_PPO, "placement": {"type": "disaggregated",
                                                        "critic_devices": 2}})
    assert path == "placement.critic_devices" and "critic_devices = 1" in msg
