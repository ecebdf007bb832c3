import os
import sys
import warnings

import pytest

from engine.config import RunConfig, validate_config

from .. import shared


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory):
    """Models and warm starts are built into a cache of this test session's (nothing
    downloaded), once: under pytest-xdist every worker shares the one under the session's
    base temp dir, and engine.tinymodel.atomic_dir lets one worker build an entry while
    the others wait for it."""
    if "RLPLANE_CACHE" not in os.environ:
        root = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            root = root.parent          # the controller's base temp dir, shared by workers
        (cache := root / "rlplane-cache").mkdir(exist_ok=True)
        os.environ["RLPLANE_CACHE"] = str(cache)
    return os.environ["RLPLANE_CACHE"]


@pytest.fixture(autouse=True)
def no_ray_left_running():
    """A test that starts Ray in its own process (a reward pool in an in-process run)
    shuts it down, or the next module's fixture, which starts its own, would fail."""
    ray = sys.modules.get("ray")
    was_running = ray is not None and ray.is_initialized()
    yield
    ray = sys.modules.get("ray")
    if not was_running and ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_dir(model_cache):
    from engine.tinymodel import ensure_base_model

    return ensure_base_model("tiny", 0)


def small_run(**overrides) -> RunConfig:
    """A run small enough for a unit-scale test: random init, 4 prompts x 4 samples."""
    data = {
        "name": "t", "steps": 2,
        "task": {"ops": ["+", "-"], "max_digits": 1, "eval_size": 16},
        "warm_start": {"steps": 0},
        "algorithm": {"group_size": 4, "minibatches": 2, "lr": 1e-3},
        "rollout": {"prompts_per_step": 4, "max_new_tokens": 4},
        # the co-run probe (~1 s at a run's start) where a test checks it
        "telemetry": {"corun_probe_s": 0.0},
    }
    for section, values in overrides.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    return validate_config(data)


def checkpointed(d, ledger) -> None:
    """``d`` as a checkpoint holding ``ledger``'s files, as the learner writes them."""
    from engine.orchestration.ledger import checkpoint_files

    for name, text in checkpoint_files(ledger).items():
        (d / name).write_text(text)


@pytest.fixture(scope="module")
def ray_gpus():
    """The test process's private local Ray (tests/shared.py LOCAL_RAY: 2 CPUs, 4 logical
    GPUs; never another user's cluster), shared by the modules that use it. A module that
    leaves a CPU or GPU held (an actor alive, a placement group) gets it started anew."""
    ray = shared.LOCAL_RAY.get()
    if not ray.is_initialized():        # shut down behind its back
        shared.LOCAL_RAY.stop()
        ray = shared.LOCAL_RAY.get()
    yield ray
    if shared.LOCAL_RAY.value is ray and not shared.ray_released(ray):
        # a warning, so the summary names the module (the rest of the session is unhurt)
        warnings.warn(f"ray_gpus: resources still held after the module: "
                      f"{ray.available_resources()} of {ray.cluster_resources()}; "
                      "starting Ray anew", stacklevel=1)
        shared.LOCAL_RAY.stop()


@pytest.fixture
def no_local_ray():
    """For a test that joins a Ray cluster of its own (one Ray per process): the local
    instance is stopped first, and started again by the next module that asks for it."""
    shared.LOCAL_RAY.stop()
