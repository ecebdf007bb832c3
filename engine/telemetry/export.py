"""Write a run's canonical metrics to the trackers a team already keeps its history in
(``telemetry.export``): TensorBoard event files, an MLflow run, a Weights & Biases run.

Each exporter is an event sink beside events.jsonl: it takes every metrics event (finite
values only, at the event's step) and ends its run on the final run.status. A tracker
that fails (a full disk, an MLflow server that went away) is logged once and dropped:
the run itself never fails because a copy of its metrics could not be written. Each
tracker's package is imported only when the run asks for it.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

from engine.events import Event, MetricsEvent, RunStatusEvent

logger = logging.getLogger(__name__)

FINAL = {"succeeded": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}


def finite(values: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items()
            if isinstance(v, int | float) and math.isfinite(v)}


class TensorBoardExport:
    """Scalars under ``out_dir/tensorboard``, one tag per metric name."""

    def __init__(self, out_dir: Path, run_name: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def metrics(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, global_step=step)

    def end(self, status: str) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MlflowExport:
    """An MLflow run named after the rlplane run: at MLFLOW_TRACKING_URI when set, else a
    file store in the run directory (mlruns/; `mlflow ui --backend-store-uri` reads it).
    Metric names keep their slashes."""

    def __init__(self, out_dir: Path, run_name: str):
        from mlflow import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # MLflow keeps its file store in maintenance mode and refuses it unless asked;
            # without a tracking server it is the one store that needs nothing installed.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (out_dir / "mlruns").resolve().as_uri()
        self.file_store = uri.startswith("file:")
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "rlplane")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(name))
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id

    def metrics(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        ts = int(1000 * time.time())
        batch = [Metric(self.name(name, values), value, ts, step)
                 for name, value in values.items()]
        for start in range(0, len(batch), 1000):     # MLflow's per-request bound
            self.client.log_batch(self.run_id, metrics=batch[start:start + 1000])

    def name(self, name: str, values: dict[str, float]) -> str:
        """The name MLflow stores: the metric's own, except in the file store, which keeps
        each name as a path: a name that is also the folder of others (a device's
        utilization and its per-phase shares) gets "/all" there."""
        if self.file_store and any(other.startswith(name + "/") for other in values):
            return name + "/all"
        return name

    def end(self, status: str) -> None:
        self.client.set_terminated(self.run_id, FINAL.get(status, "FINISHED"))

    def close(self) -> None:
        pass


class WandbExport:
    """A W&B run named after the rlplane run, its files in the run directory; WANDB_MODE
    (offline, online) and WANDB_PROJECT are read by wandb itself (project: "rlplane")."""

    def __init__(self, out_dir: Path, run_name: str):
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "rlplane"),
                              name=run_name, dir=str(out_dir), reinit="create_new")

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def end(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "succeeded" else 1)

    def close(self) -> None:
        self.run.finish()


EXPORTERS = {"tensorboard": TensorBoardExport, "mlflow": MlflowExport, "wandb": WandbExport}


class ExportSink:
    """The run's metrics to each tracker in ``names``; never raises into the run."""

    def __init__(self, names: list[str], out_dir: Path, run_name: str):
        self.trackers: dict[str, object] = {}
        self.last_step = -1
        for name in names:
            self._guard(name, lambda n=name: self.trackers.__setitem__(
                n, EXPORTERS[n](Path(out_dir), run_name)))

    def _guard(self, name: str, action) -> None:
        try:
            action()
        except Exception as exc:  # a tracker's failure is not the run's
            logger.warning("telemetry.export %r stopped: %s: %s", name, type(exc).__name__,
                           exc)
            self.trackers.pop(name, None)

    def emit(self, event: Event) -> None:
        if isinstance(event, MetricsEvent):
            values = finite(event.values)
            if values:
                for name, tracker in list(self.trackers.items()):
                    self._guard(name, lambda t=tracker: t.metrics(event.step, values))
        elif isinstance(event, RunStatusEvent) and event.status in FINAL:
            for name, tracker in list(self.trackers.items()):
                self._guard(name, lambda t=tracker: t.end(event.status))

    def close(self) -> None:
        for name, tracker in list(self.trackers.items()):
            self._guard(name, tracker.close)
        self.trackers.clear()
