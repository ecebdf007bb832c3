"""engine/frameworks.py: each framework's metric names -> rlplane's canonical names."""

import pytest

from engine import api
from engine import frameworks as F
from engine import metrics as M

KNOWN = set(M.METRICS)


def test_every_framework_has_a_table_and_a_label():
    assert set(F.MAPPINGS) == set(F.FRAMEWORKS)
    assert set(F.FRAMEWORKS) | {F.NATIVE} == set(F.FRAMEWORK_LABELS)


@pytest.mark.parametrize("framework", F.FRAMEWORKS)
def test_every_mapped_target_is_a_metric_of_the_vocabulary(framework):
    unknown = {theirs: ours for theirs, ours in F.MAPPINGS[framework].items()
               if ours not in KNOWN}
    assert not unknown, f"{framework} maps to names engine/metrics.py does not define"


@pytest.mark.parametrize("framework", F.FRAMEWORKS)
def test_no_two_of_a_frameworks_names_feed_one_metric(framework):
    """Two names for one canonical metric would overwrite each other within a step."""
    targets = list(F.MAPPINGS[framework].values())
    doubled = {t for t in targets if targets.count(t) > 1}
    assert not doubled, f"{framework}: {sorted(doubled)} fed by more than one name"


@pytest.mark.parametrize("framework", F.FRAMEWORKS)
def test_no_name_of_a_framework_is_itself_a_canonical_name_meant_otherwise(framework):
    """A their-name spelled like one of ours would be ambiguous: ours, or theirs mapped?"""
    clashes = {theirs for theirs, ours in F.MAPPINGS[framework].items()
               if theirs in KNOWN and theirs != ours}
    assert not clashes


def test_verl_names_come_out_canonical_and_the_rest_as_they_were():
    values = {"timing_s/gen": 41.5, "timing_s/update_actor": 12.0, "actor/pg_clipfrac": 0.02,
              "response_length/clip_ratio": 0.25, "response_length/mean": 300.0,
              "critic/score/mean": 0.4, "training/rollout_probs_diff_mean": 0.01,
              "perf/mfu/actor_infer": 0.3}
    assert F.canonical_metrics("verl", values) == {
        "time/rollout_s": 41.5, "time/learner_s": 12.0, "learner/clip_frac": 0.02,
        "response/truncated_frac": 0.25, "response_length/mean": 300.0, "reward/mean": 0.4,
        "prob_gap/mean": 0.01, "perf/mfu/actor_infer": 0.3}


def test_trl_names_map_as_on_log_gives_them_and_as_tensorboard_rewrites_them():
    on_log = {"reward": 0.5, "frac_reward_zero_std": 0.25, "completions/clipped_ratio": 0.1,
              "sampling/sampling_logp_difference/mean": 0.02, "kl": 0.001,
              "sampling/importance_sampling_ratio/mean": 0.99, "eval_reward": 0.6}
    expected = {"reward/mean": 0.5, "samples/zero_std_group_frac": 0.25,
                "response/truncated_frac": 0.1, "logprob_gap/mean": 0.02,
                "learner/kl_ref": 0.001, "eval/reward_mean": 0.6}
    assert F.canonical_metrics("trl", on_log) == {
        **expected, "sampling/importance_sampling_ratio/mean": 0.99}
    rewritten = {"train/reward": 0.5, "train/frac_reward_zero_std": 0.25,
                 "train/completions/clipped_ratio": 0.1,
                 "train/sampling/sampling_logp_difference/mean": 0.02, "train/kl": 0.001,
                 "train/sampling/importance_sampling_ratio/mean": 0.99, "eval/reward": 0.6}
    assert F.canonical_metrics("trl", rewritten) == {
        **expected, "train/sampling/importance_sampling_ratio/mean": 0.99}


def test_a_prefix_is_stripped_only_where_the_framework_rewrites_it():
    assert F.canonical_metrics("openrlhf", {"kl": 1.0}) == {"kl": 1.0}
    assert F.canonical_metrics("verl", {"train/reward": 1.0}) == {"train/reward": 1.0}


def test_a_mapped_name_wins_over_the_same_canonical_name_sent_as_is():
    assert F.canonical_metrics("openrlhf", {"train/kl": 2.0, "learner/kl_ref": 1.0}) == {
        "learner/kl_ref": 2.0}


def test_a_script_and_the_native_names_pass_through():
    values = {"reward/mean": 1.0, "my/own": 2.0}
    assert F.canonical_metrics("script", values) == values
    assert F.canonical_metrics(F.NATIVE, values) == values


def test_their_names_says_what_the_framework_would_have_to_log():
    assert F.their_names("verl", M.TIME_ROLLOUT_S) == ["timing_s/gen"]
    assert F.their_names("openrlhf", M.LEARNER_KL_REF) == ["train/kl"]
    assert F.their_names("trl", M.LOGPROB_GAP_MEAN) == ["sampling/sampling_logp_difference/mean"]
    # nothing of veRL's means the reward's spread: it would have to log ours
    assert F.their_names("verl", M.REWARD_STD) == [M.REWARD_STD]
    assert F.their_names("script", M.BUBBLE) == [M.BUBBLE]


def test_an_unknown_framework_is_named_in_the_error():
    with pytest.raises(ValueError, match="'mystery'.*trl, verl"):
        F.canonical_metrics("mystery", {})


def test_the_facade_re_exports_the_mapping_for_the_web_side():
    assert api.canonical_metrics is F.canonical_metrics
    assert api.their_names is F.their_names
    assert api.FRAMEWORKS == F.FRAMEWORKS and api.FRAMEWORK_LABELS is F.FRAMEWORK_LABELS
