"""rlplane.tail: files written by the frameworks' own writers, tailed into a run under the
framework's names, which ingest maps to ours (engine.frameworks)."""

import json
import math
import sys
import types

import pytest

from engine import metrics as M
from engine.frameworks import canonical_metrics
from rlplane import cli
from rlplane.tail import (
    MetricsJsonlTail,
    RolloutDumpTail,
    TensorBoardTail,
    tailer_for,
    watch_files,
)


class Recorder:
    """rlplane.track's Run at the seam the tailers feed."""

    def __init__(self):
        self.metrics: dict[int, dict] = {}
        self.rows: dict[int, list] = {}
        self.stop_requested = False
        self.finished = None

    def log(self, step, metrics):
        self.metrics.setdefault(step, {}).update(metrics)

    def samples(self, step, rows):
        self.rows.setdefault(step, []).extend(rows)

    def finish(self, status="succeeded", reason=""):
        self.finished = status


def orjson_like(obj) -> bytes:
    """orjson.dumps(obj, option=OPT_SERIALIZE_NUMPY): compact UTF-8, NaN/Inf as null."""
    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v
    return json.dumps(clean(obj), separators=(",", ":"), ensure_ascii=False).encode()


class VerlFileLogger:
    """veRL is not installed here (nor is orjson, which it writes with), so this mirrors
    verl/utils/tracking.py FileLogger, volcengine/verl@b178a3cd lines 236-255, line for line:
    open(filepath, "wb", buffering=0); log(data, step) writes
    orjson.dumps({"step": step, "data": data}, option=OPT_SERIALIZE_NUMPY) + b"\\n"."""

    def __init__(self, filepath):
        self.fp = open(filepath, "wb", buffering=0)  # noqa: SIM115

    def log(self, data, step):
        data = {"step": step, "data": data}
        self.fp.write(orjson_like(data) + b"\n")

    def finish(self):
        self.fp.close()


def verl_dump_generations(global_steps, inputs, outputs, gts, scores, reward_extra_infos_dict,
                          dump_path):
    """verl/trainer/ppo/ray_trainer.py RayPPOTrainer._dump_generations, volcengine/verl@b178a3cd
    lines 396-422, with self.global_steps as an argument."""
    dump_path.mkdir(parents=True, exist_ok=True)
    filename = dump_path / f"{global_steps}.jsonl"
    n = len(inputs)
    base_data = {"input": inputs, "output": outputs, "gts": gts, "score": scores,
                 "step": [global_steps] * n}
    for k, v in reward_extra_infos_dict.items():
        if len(v) == n:
            base_data[k] = v
    lines = []
    for i in range(n):
        entry = {k: v[i] for k, v in base_data.items()}
        lines.append(json.dumps(entry, ensure_ascii=False))
    with open(filename, "w") as f:
        f.write("\n".join(lines) + "\n")


def test_verl_file_logger_lines_come_out_once_each_under_canonical_names(tmp_path):
    path = tmp_path / "metrics.jsonl"
    writer = VerlFileLogger(path)
    tail = MetricsJsonlTail(path, "verl")
    writer.log({"timing_s/gen": 41.5, "timing_s/update_actor": 12.0,
                "response_length/clip_ratio": 0.25, "actor/pg_clipfrac": float("nan"),
                "critic/score/mean": 0.4, "training/global_step": 1}, step=1)
    first = tail.poll()
    writer.log({"timing_s/gen": 39.0, "critic/score/mean": 0.5}, step=2)
    second = tail.poll()
    assert tail.poll() == []                                  # read once
    assert [r.step for r in first] == [1] and [r.step for r in second] == [2]
    assert canonical_metrics("verl", first[0].values) == {
        M.TIME_ROLLOUT_S: 41.5, M.TIME_LEARNER_S: 12.0, M.RESPONSE_TRUNCATED_FRAC: 0.25,
        M.REWARD_MEAN: 0.4, "training/global_step": 1.0}     # NaN (orjson: null) dropped
    writer.finish()


def test_a_line_still_being_written_waits_for_its_newline(tmp_path):
    path = tmp_path / "metrics.jsonl"
    line = orjson_like({"step": 3, "data": {"timing_s/gen": 1.0}}) + b"\n"
    tail = MetricsJsonlTail(path)
    assert tail.poll() == []                                  # not there yet
    path.write_bytes(line[:10])
    assert tail.poll() == []
    with open(path, "ab") as f:
        f.write(line[10:])
    assert [(r.step, r.values) for r in tail.poll()] == [(3, {"timing_s/gen": 1.0})]


def test_a_line_that_is_not_json_is_skipped_and_the_watch_goes_on(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'ep":1}\n' + orjson_like({"step": 4, "data": {"actor/lr": 1e-6}}) + b"\n")
    assert [(r.step, r.values) for r in MetricsJsonlTail(path).poll()] == [
        (4, {"actor/lr": 1e-6})]
    assert "not a JSON object" in caplog.text


def test_prime_rl_file_monitor_rows_are_read_flat():
    """src/prime_rl/monitors/file.py (0.8.0): {"step": n, "time": t, **metrics}."""
    from rlplane.tail import any_record

    row = {"step": 7, "time": 1.7e9, "off_policy/max": 2.0, "optim/lr": 1e-6}
    assert any_record(row).values == {"off_policy/max": 2.0, "optim/lr": 1e-6}
    assert canonical_metrics("prime-rl", any_record(row).values) == {
        M.STALENESS_MAX: 2.0, M.LEARNER_LR: 1e-6}


def test_verl_rollout_dump_becomes_sample_rows_per_step(tmp_path):
    dump = tmp_path / "rollouts"
    verl_dump_generations(1, ["1+1="], ["2"], ["2"], [1.0], {"acc": [True]}, dump)
    tail = RolloutDumpTail(dump)
    verl_dump_generations(2, ["2+2=", "3+3="], ["4", "7"], ["4", "6"], [1.0, 0.0], {}, dump)
    records = tail.poll()
    assert [(r.step, r.rows) for r in records] == [
        (1, [{"prompt": "1+1=", "completion": "2", "reward": 1.0}]),
        (2, [{"prompt": "2+2=", "completion": "4", "reward": 1.0},
             {"prompt": "3+3=", "completion": "7", "reward": 0.0}])]
    assert tail.poll() == []


def test_openrlhf_tensorboard_scalars_old_and_new_style_are_tailed_incrementally(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    # as OpenRLHF's TensorboardLogger.log_train (openrlhf/utils/logging_utils.py, 0.11.0)
    writer = SummaryWriter(log_dir=str(tmp_path / "tb" / "run"))
    logs = {"kl": 0.01, "policy_loss": 0.3, "timing/generation": 20.0,
            "rollout/reward_mean": 0.5}
    for k, v in logs.items():
        writer.add_scalar(f"train/{k}", v, 1)
    writer.add_text("train/generated_samples", "Sample:\\n2+2=4\\n\\nReward: 1.0000", 1)
    writer.flush()
    tail = tailer_for(tmp_path / "tb")
    assert isinstance(tail, TensorBoardTail)
    first = tail.poll()
    writer.add_scalar("train/kl", 0.02, 2, new_style=True)   # a tensor-encoded scalar
    writer.add_scalar("train/policy_loss", 0.25, 2)
    writer.flush()
    second = tail.poll()
    writer.close()
    assert [r.step for r in first] == [1] and [r.step for r in second] == [2]
    assert canonical_metrics("openrlhf", first[0].values) == pytest.approx({
        M.LEARNER_KL_REF: 0.01, M.LEARNER_LOSS: 0.3, M.TIME_ROLLOUT_S: 20.0,
        M.REWARD_MEAN: 0.5})
    assert canonical_metrics("openrlhf", second[0].values) == pytest.approx({
        M.LEARNER_KL_REF: 0.02, M.LEARNER_LOSS: 0.25})
    assert tail.poll() == []


def test_watch_files_feeds_the_run_and_finds_a_path_that_appears_later(tmp_path):
    path, dump = tmp_path / "metrics.jsonl", tmp_path / "rollouts"
    writer = VerlFileLogger(path)
    writer.log({"timing_s/gen": 5.0}, step=1)
    polls = []

    def stop():
        polls.append(1)
        if len(polls) == 1:         # the rollout dump appears after the first poll
            verl_dump_generations(1, ["p"], ["c"], [None], [0.5], {}, dump)
        return len(polls) > 1

    run = Recorder()
    watch_files(run, [path, dump], "verl", poll_s=0, stop=stop)
    assert run.metrics == {1: {"timing_s/gen": 5.0}}
    assert run.rows == {1: [{"prompt": "p", "completion": "c", "reward": 0.5}]}
    writer.finish()


def test_watch_files_command_tails_into_the_run_track_opens(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    VerlFileLogger(path).log({"timing_s/gen": 5.0}, step=1)
    run, opened = Recorder(), {}
    run.stop_requested = True       # asked to stop: one last poll, then the run ends stopped

    def init(url=None, token=None, run_id=None):
        opened.update(url=url, token=token, run_id=run_id)
        return run

    fake = types.SimpleNamespace(init=init)
    monkeypatch.setitem(sys.modules, "rlplane.track", fake)
    monkeypatch.setattr("rlplane.track", fake, raising=False)
    code = cli.main(["watch-files", "--run", "12", "--token", "t0k", "--url", "http://cp",
                     "--framework", "verl", "--interval", "0", str(path)])
    assert code == 0
    assert opened == {"url": "http://cp", "token": "t0k", "run_id": 12}
    assert run.metrics == {1: {"timing_s/gen": 5.0}} and run.finished == "stopped"
