from pathlib import Path

import pytest

from engine.config import (
    ConfigError,
    LongTailTaskConfig,
    RunConfig,
    dump_config,
    load_config,
    loads_config,
    validate_config,
)

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.toml"))


def test_there_are_example_configs():
    assert len(CONFIGS) >= 2


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_example_config_loads_and_round_trips(path):
    cfg = load_config(path)
    assert loads_config(dump_config(cfg)) == cfg


def errors_of(data) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as exc:
        validate_config(data)
    return exc.value.errors


def test_an_unknown_key_names_its_path_and_the_allowed_keys():
    [(path, msg)] = errors_of({"rollout": {"tempreature": 0.7}})
    assert path == "rollout.tempreature"
    assert "unknown key" in msg and "temperature" in msg and "top_p" in msg


def test_an_out_of_range_value_names_the_field_and_the_bound():
    [(path, msg)] = errors_of({"rollout": {"temperature": 5}})
    assert path == "rollout.temperature"
    assert "less than or equal to 2" in msg and "5" in msg


def test_a_wrong_type_names_the_field():
    [(path, msg)] = errors_of({"algorithm": {"group_size": "eight"}})
    assert path == "algorithm.group_size" and "integer" in msg


def test_an_unknown_choice_lists_the_allowed_types():
    [(path, msg)] = errors_of({"rollout": {"type": "sglang"}})
    assert path == "rollout" and "'sglang'" in msg and "'torch'" in msg


def test_unknown_keys_inside_a_chosen_type_list_that_types_keys():
    [(path, msg)] = errors_of({"task": {"type": "reverse", "max_digits": 2}})
    assert path == "task.max_digits" and "tail_alpha" in msg


def test_several_problems_are_reported_together():
    errs = errors_of({"steps": 0, "model": {"size": "huge"}, "bogus": 1})
    assert {p for p, _ in errs} == {"steps", "model.size", "bogus"}
    assert any("'tiny'" in m and "'small'" in m for _, m in errs)


def test_cross_field_bounds_are_checked():
    [(path, msg)] = errors_of({"task": {"min_digits": 3, "max_digits": 1}})
    assert path == "task" and "min_digits" in msg


def test_the_budget_must_fit_the_longest_answer():
    [(path, msg)] = errors_of({"task": {"type": "reverse", "max_len": 40},
                               "rollout": {"max_new_tokens": 10}})
    assert path == "rollout.max_new_tokens" and "41" in msg


def test_a_table_without_type_means_the_default_choice():
    cfg = validate_config({"task": {"max_digits": 2}})
    assert cfg.task.type == "arithmetic"
    assert isinstance(validate_config({"task": {"type": "reverse"},
                                       "rollout": {"max_new_tokens": 64}}).task,
                      LongTailTaskConfig)


def test_bad_toml_is_a_config_error(tmp_path):
    p = tmp_path / "x.toml"
    p.write_text("steps = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)


def test_every_field_has_a_docstring():
    def walk(model):
        for name, field in model.model_fields.items():
            if name != "type":
                assert field.description, f"{model.__name__}.{name} has no docstring"
            ann = field.annotation
            for sub in getattr(ann, "__args__", (ann,)):
                if isinstance(sub, type) and hasattr(sub, "model_fields"):
                    walk(sub)
    walk(RunConfig)


def test_the_algorithm_takes_verl_style_knobs_and_keeps_the_symmetric_clip():
    cfg = validate_config({"algorithm": {"adv_estimator": "rloo", "clip_eps_high": 0.28,
                                         "loss_agg_mode": "seq-mean-token-sum",
                                         "dynamic_sampling": True,
                                         "overlong": {"type": "filter"}}})
    assert (cfg.algorithm.clip_low, cfg.algorithm.clip_high) == (0.2, 0.28)
    assert (validate_config({"algorithm": {"clip_eps": 0.1}}).algorithm.clip_high) == 0.1
    assert loads_config(dump_config(cfg)) == cfg


def test_algorithm_mistakes_name_the_field_and_the_fix():
    [(path, msg)] = errors_of({"algorithm": {"adv_estimator": "rloo", "normalize_std": False}})
    assert path == "algorithm.normalize_std" and "remove normalize_std" in msg
    [(path, msg)] = errors_of({"algorithm": {"overlong": {"type": "penalty", "buffer_len": 8}},
                               "rollout": {"max_new_tokens": 8}})
    assert path == "algorithm.overlong.buffer_len" and "below max_new_tokens" in msg
    [(path, msg)] = errors_of({"algorithm": {"loss_agg_mode": "sum"}})
    assert path == "algorithm.loss_agg_mode" and "seq-mean-token-mean" in msg
    [(path, msg)] = errors_of({"algorithm": {"overlong": {"type": "truncate"}}})
    assert path == "algorithm.overlong" and "'filter'" in msg


def test_every_reward_file_the_readme_names_exists():
    import re

    repo = Path(__file__).parents[2]
    named = re.findall(r'function = "([^":]+\.py):\w+"', (repo / "README.md").read_text())
    assert named and [p for p in named if not (repo / p).is_file()] == []


def test_a_worker_kill_is_refused_where_no_worker_could_replace_the_dead_one():
    kill = {"kill_rollout_worker": {"at_step": 2}}
    [(path, msg)] = errors_of({"faults": kill})                      # in the driver's process
    assert path == "faults.kill_rollout_worker" and "placement.ray = true" in msg
    [(path, msg)] = errors_of({"faults": kill, "placement": {"type": "disaggregated"},
                               "weight_sync": {"type": "broadcast"}})
    assert path == "faults.kill_rollout_worker" and '"object_store" or "shm"' in msg
    validate_config({"faults": kill, "placement": {"type": "disaggregated"},
                     "weight_sync": {"type": "object_store"}})


def test_a_compiled_learner_is_refused_where_it_would_be_sharded_or_routed_by_hooks():
    [(path, msg)] = errors_of({"learner": {"compile": True},
                               "placement": {"type": "disaggregated", "learner_devices": 2},
                               "weight_sync": {"type": "object_store"}})
    assert path == "learner.compile" and "placement.learner_devices = 1" in msg
    [(path, msg)] = errors_of({"learner": {"compile": True, "routing_replay": True}})
    assert path == "learner.compile" and "learner.compile = false" in msg
    validate_config({"learner": {"compile": True}})
