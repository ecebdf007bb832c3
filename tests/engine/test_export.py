"""telemetry.export (issue 29, item 7): a run of rlplane's own engine writes its canonical
metrics to TensorBoard, MLflow and W&B too, read back here with each tool's own reader."""

import json
import struct
import time

import pytest

from engine import metrics as M
from engine.api import run_local
from engine.config import ConfigError, validate_config

from .conftest import small_run


@pytest.fixture(scope="module")
def exported(tmp_path_factory, model_cache):
    """One 2-step run exporting to all three trackers (W&B offline, MLflow's file store)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path_factory.mktemp("export")
    cfg = small_run(telemetry={"export": ["tensorboard", "mlflow", "wandb"]})
    summary = run_local(cfg, out)
    yield out, summary
    mp.undo()


def test_tensorboard_holds_every_step_of_the_reward(exported):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, summary = exported
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()

    steps = [e.step for e in acc.Scalars(M.REWARD_MEAN)]
    assert summary.status == "succeeded" and steps == [0, 1], steps
    assert M.TIME_STEP_S in acc.Tags()["scalars"]


def test_mlflow_holds_the_run_with_its_history_and_end_status(exported):
    from mlflow import MlflowClient

    out, _ = exported
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("rlplane").experiment_id])

    history = client.get_metric_history(run.info.run_id, M.REWARD_MEAN)
    assert run.info.status == "FINISHED" and run.info.run_name == "t"
    assert sorted(m.step for m in history) == [0, 1]


def wandb_history(path) -> list[dict]:
    """The history rows of an offline W&B run file, parsed with wandb's own protobuf
    Record. wandb 0.31 keeps no Python reader of its files (wandb-core writes them), so
    the container, LevelDB's log format (32 KiB blocks of crc/length/type-framed chunks
    after a 7-byte ':W&B' header), is unwrapped here."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, chunks, rows = path.read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:                    # a block's tail padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        chunks = chunk if kind in (1, 2) else chunks + chunk    # FULL/FIRST start one
        if kind in (1, 4):                                      # FULL/LAST end one
            record = pb.Record.FromString(chunks)
            if record.WhichOneof("record_type") == "history":
                rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                             for i in record.history.item})
    return rows


def reward_rows(out, wait_s: float = 60.0) -> list[dict]:
    """The history rows with the reward, once wandb-core has written them: run.finish()
    returns when the service acknowledges it, and its stream closes the file a moment later
    (a CI run under load read the file in between: no row yet). Waits up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        (run_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
        rows = [r for r in wandb_history(run_file) if M.REWARD_MEAN in r]
        if len(rows) >= 2 or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def test_wandb_offline_run_holds_every_step(exported):
    out, summary = exported
    rows = reward_rows(out)

    assert [r["_step"] for r in rows] == [0, 1]
    assert rows[-1][M.REWARD_MEAN] == pytest.approx(summary.last_metrics[M.REWARD_MEAN])


def test_each_tracker_is_named_once():
    with pytest.raises(ConfigError, match="telemetry.export"):
        validate_config({"telemetry": {"export": ["mlflow", "mlflow"]}})
