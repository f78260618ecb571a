"""What a user watches: per-version metrics as JSONL in the run directory (the same objects go to the
`{ps:R}:metrics` stream, which `python -m ops tail metrics --follow` shows live), and the trackers fed from
it: TensorBoard scalars when it is installed (trainer/tensorboard_log.py), an MLflow run when `mlflow_uri`
names a tracking store (trainer/mlflow_run.py); PNG plots at the end (trainer/run_plots.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import structlog

from streams.run_dir import METRICS, read_records
from trainer.mlflow_run import MLflowRun
from trainer.run_plots import draw
from trainer.tensorboard_log import tensorboard
from trainer.trackers import tracked

MLFLOW_RETRY_S = 60.0  # after MLflow failed mid-run, its next try waits this long (metrics.jsonl has it all)
log = structlog.get_logger("trainer.metrics")


class MetricsSink:
    """metrics.jsonl, the record of the run, and the trackers fed from it. MLflow failing mid-run (its server
    away, its store refusing) never stops or fails the training: the sink says so once, tries again at most
    every `retry_s`, and then logs what MLflow missed from metrics.jsonl (`catch_up`); at the end it tries
    once more, and a resume catches up too."""

    def __init__(self, run_dir: Path, mlflow: MLflowRun | None = None, retry_s: float = MLFLOW_RETRY_S) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / METRICS
        self._tensorboard = tensorboard(run_dir)
        self.mlflow = mlflow
        self.retry_s = retry_s
        self.mlflow_behind = False  # records of metrics.jsonl MLflow has not been given
        self._retry_at = 0.0

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "ab") as handle:
            handle.write(orjson.dumps(record) + b"\n")
        numbers, step = tracked(record)
        if self._tensorboard is not None:
            self._tensorboard(numbers, step)
        if self.mlflow is not None:
            self._to_mlflow(lambda mlflow: mlflow(numbers, step), caught_up_by_the_record=True)

    def _to_mlflow(self, call, caught_up_by_the_record: bool = False) -> bool:
        """`call(self.mlflow)`, after what MLflow missed (which holds the record just written, so its call is
        then not made again); whether MLflow has everything now."""
        if self.mlflow_behind and time.monotonic() < self._retry_at:
            return False
        try:
            if self.mlflow_behind:
                self.mlflow.catch_up(self.records())
                self.mlflow_behind = False
                if caught_up_by_the_record:
                    return True
            call(self.mlflow)
            return True
        except Exception as e:  # noqa: BLE001 - MLflow's client raises what its store or HTTP stack raises
            self._mlflow_failed(e)
            return False

    def _mlflow_failed(self, e: Exception) -> None:
        """MLflow refused: said once an outage, and not tried again for `retry_s`."""
        if not self.mlflow_behind:
            log.warning(
                "mlflow_unavailable",
                uri=self.mlflow.shown_uri,
                error=f"{type(e).__name__}: {e}"[:500],
                retry_s=self.retry_s,
                record=str(self.path),
            )
        self.mlflow_behind, self._retry_at = True, time.monotonic() + self.retry_s

    def catch_up(self) -> int:
        """Log to TensorBoard and MLflow the records of metrics.jsonl they lack (a trainer killed between the
        writes), at a resume; how many records the one that lacked the most got."""
        records = self.records()
        counts = [self._tensorboard.catch_up(records)] if self._tensorboard is not None else []
        if self.mlflow is not None:
            try:
                counts.append(self.mlflow.catch_up(records))
            except Exception as e:  # noqa: BLE001 - as in _to_mlflow: MLflow away is no reason to stop
                self._mlflow_failed(e)
        return max(counts, default=0)

    def finish(self, artifacts: list[Path], interrupted: bool) -> None:
        """The end of this trainer's part of the run: the artifacts go to MLflow, and its run is ended. MLflow
        still away: said, and left to a resume (or `python -m trainer` again on the finished run's folder)."""
        if self.mlflow is not None:
            self._retry_at = 0.0  # one last try now
            if not self._to_mlflow(lambda mlflow: mlflow.finish(artifacts, interrupted)):
                log.warning("mlflow_not_finished", uri=self.mlflow.shown_uri, record=str(self.path))

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.path)

    def plots(self) -> list[Path]:
        """The run's plots from metrics.jsonl (trainer/run_plots.py). [] when matplotlib is missing."""
        return draw(self.run_dir, self.records())
