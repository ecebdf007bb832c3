"""[model] path: what a bad directory reports, field and fix, before anything runs."""

import json
import shutil

import pytest

from engine.config import ConfigError, dump_config, loads_config, validate_config

from .hf_models import build_hf_model


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    return build_hf_model(tmp_path_factory.mktemp("hf") / "qwen3", "qwen3")


@pytest.fixture
def copy(good_dir, tmp_path):
    """A fresh copy of the good directory, to break one file of."""
    return shutil.copytree(good_dir, tmp_path / "model")


def the_error(model: dict) -> tuple[str, str]:
    with pytest.raises(ConfigError) as exc:
        validate_config({"model": model})
    [(path, msg)] = exc.value.errors
    return path, msg


def test_a_good_directory_validates_and_round_trips(good_dir):
    cfg = validate_config({"model": {"path": str(good_dir)}})
    assert cfg.model.path == str(good_dir) and cfg.model.size is None
    assert not cfg.model.trust_remote_code
    assert loads_config(dump_config(cfg)) == cfg


def test_without_size_or_path_the_built_in_tiny_model_is_used():
    cfg = validate_config({})
    assert cfg.model.size == "tiny" and cfg.model.path is None
    assert cfg.warm_start_steps == 300


def test_a_path_model_skips_the_warm_start_unless_it_is_set(good_dir):
    assert validate_config({"model": {"path": str(good_dir)}}).warm_start_steps == 0
    assert validate_config({"model": {"path": str(good_dir)},
                            "warm_start": {"steps": 20}}).warm_start_steps == 20


def test_size_and_path_together_name_both(good_dir):
    path, msg = the_error({"size": "tiny", "path": str(good_dir)})
    assert path == "model.path"
    assert "model.size or model.path, not both" in msg and "remove model.size" in msg


def test_a_missing_directory_says_so_and_that_workers_need_it_too(tmp_path):
    path, msg = the_error({"path": str(tmp_path / "nope")})
    assert path == "model.path"
    assert f"{tmp_path / 'nope'} does not exist" in msg and "every Ray worker" in msg


def test_a_file_is_not_a_model_directory(copy):
    path, msg = the_error({"path": str(copy / "config.json")})
    assert path == "model.path" and "is a file" in msg


def test_a_directory_without_config_json_names_it(copy):
    (copy / "config.json").unlink()
    path, msg = the_error({"path": str(copy)})
    assert path == "model.path" and "has no config.json" in msg
    assert "huggingface-cli download" in msg


def test_a_model_that_is_not_a_causal_lm_is_refused(copy):
    cfg = json.loads((copy / "config.json").read_text())
    cfg["architectures"] = ["Qwen3ForSequenceClassification"]
    (copy / "config.json").write_text(json.dumps(cfg))
    path, msg = the_error({"path": str(copy)})
    assert path == "model.path"
    assert "['Qwen3ForSequenceClassification'], not a causal LM (...ForCausalLM)" in msg


def test_a_config_without_architectures_is_refused(copy):
    cfg = json.loads((copy / "config.json").read_text())
    del cfg["architectures"]
    (copy / "config.json").write_text(json.dumps(cfg))
    path, msg = the_error({"path": str(copy)})
    assert path == "model.path" and "names no architectures" in msg


def test_missing_weights_are_named(copy):
    (copy / "model.safetensors").unlink()
    path, msg = the_error({"path": str(copy)})
    assert path == "model.path"
    assert "holds no weights (model.safetensors" in msg and "pytorch_model*.bin" in msg


def test_a_missing_tokenizer_is_named_with_the_fix(copy):
    (copy / "tokenizer.json").unlink()
    (copy / "tokenizer_config.json").unlink()
    path, msg = the_error({"path": str(copy)})
    assert path == "model.path"
    assert "holds no tokenizer (tokenizer.json or tokenizer_config.json)" in msg
    assert "tokenizer.save_pretrained" in msg


def test_a_tokenizer_config_without_a_vocabulary_is_named(copy):
    (copy / "tokenizer.json").unlink()
    path, msg = the_error({"path": str(copy)})
    assert path == "model.path"
    assert "tokenizer_config.json but no vocabulary (tokenizer.json" in msg


def test_a_stored_config_reads_back_without_its_files(copy):
    cfg = validate_config({"model": {"path": str(copy)}})
    shutil.rmtree(copy)
    with pytest.raises(ConfigError):
        validate_config(cfg.model_dump(mode="json"))
    again = validate_config(cfg.model_dump(mode="json"), check_files=False)
    assert again == cfg


def test_validating_a_config_imports_no_torch(good_dir):
    import subprocess
    import sys

    code = ("import sys; from engine.config import validate_config; "
            f"validate_config({{'model': {{'path': {str(good_dir)!r}}}}}); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_vllm_context_longer_than_the_model_allows_is_refused(good_dir):
    # hf_models' checkpoints allow 512 positions
    with pytest.raises(ConfigError) as exc:
        validate_config({"model": {"path": str(good_dir)},
                         "rollout": {"type": "vllm", "max_model_len": 1024}})
    [(path, msg)] = exc.value.errors
    assert path == "rollout.max_model_len"
    assert "max_position_embeddings = 512" in msg and "<= 512" in msg
    validate_config({"model": {"path": str(good_dir)},
                     "rollout": {"type": "vllm", "max_model_len": 512}})
