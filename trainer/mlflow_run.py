"""The proofstream run's MLflow run, when `mlflow_uri` names a tracking store: settings as params, every
version's numbers with step = version, evaluations under `eval/`, plots and report.json as artifacts, and the
same MLflow run continued when the trainer restarts (its id in `<run dir>/mlflow.json`)."""

from __future__ import annotations

import time
import urllib.parse
from pathlib import Path
from typing import Any

import orjson

from streams.run_dir import MLFLOW
from trainer.trackers import CAUGHT_UP_BY, log_missing


class MLflowUnavailable(RuntimeError):
    """`mlflow_uri` is set but MLflow cannot be used (not installed, or the store refuses)."""


RECORD = MLFLOW  # in the run directory: which MLflow run this run logs to


class MLflowRun:
    """The proofstream run's MLflow run, through MLflow's own client (`MlflowClient`, no global state).

    Created at the first start with the run's settings as params (tags name the proofstream run and its
    directory); its id is kept in `<run dir>/mlflow.json`, so a restarted trainer continues the same MLflow
    run (params are written once: MLflow refuses to change one). For a local store (sqlite:///..., file:...)
    artifacts go beside it (`<store folder>/mlartifacts`), not into the working directory."""

    def __init__(self, run_dir: Path, uri: str, experiment: str, params: dict[str, Any]) -> None:
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise MLflowUnavailable(
                f"mlflow_uri is set but MLflow is not installed: pip install '.[mlflow]' ({e})"
            ) from e
        self._metric = Metric
        self.uri, self.shown_uri = uri, shown(uri)
        if uri.startswith(("http://", "https://")):
            _answers(uri)
        self.client = MlflowClient(tracking_uri=uri)
        record = run_dir / RECORD
        doc = orjson.loads(record.read_bytes()) if record.exists() else {}
        try:
            if doc.get("uri") == uri and doc.get("run_id"):
                self.run_id = doc["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
                self.resumed = True
                return
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = (
                found.experiment_id
                if found is not None
                else self.client.create_experiment(experiment, artifact_location=_artifacts_beside(uri, experiment))
            )
            tags = {"proofstream.run": str(params.get("run", "")), "proofstream.run_dir": str(run_dir.resolve())}
            self.run_id = self.client.create_run(
                experiment_id, run_name=str(params.get("run") or run_dir.name), tags=tags
            ).info.run_id
            self.client.log_batch(
                self.run_id,
                params=[Param(k, _param(v)) for k, v in sorted(params.items())],
                tags=[RunTag("mlflow.source.name", "python -m trainer")],
            )
        except Exception as e:  # noqa: BLE001 - MLflow's store errors have no common base but MlflowException
            raise MLflowUnavailable(f"MLflow at {shown(uri)}: {e}") from e
        run_dir.mkdir(parents=True, exist_ok=True)
        record.write_bytes(orjson.dumps({"uri": uri, "run_id": self.run_id, "experiment": experiment}))
        self.resumed = False

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self._metric(k, v, now, step) for k, v in metrics.items()])

    def catch_up(self, records: list[dict[str, Any]]) -> int:
        """Log the records whose version this run has no `reward_mean` (an update) or `eval/held_out_reward`
        (an evaluation) for; how many."""
        logged = {key: {m.step for m in self.client.get_metric_history(self.run_id, key)} for key in CAUGHT_UP_BY}
        return log_missing(self, records, logged)

    def finish(self, artifacts: list[Path], interrupted: bool) -> None:
        for path in artifacts:
            if path.exists():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, status="KILLED" if interrupted else "FINISHED")


PROBE_TIMEOUT_S = 10.0


def shown(uri: str) -> str:
    """`uri` with the password of its user info (http://user:pw@host) hidden, for messages and logs."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _answers(uri: str) -> None:
    """A tracking server that answers at all (any HTTP status: /health, or auth in front of it); else
    MLflowUnavailable at once. MLflow's own client would retry for minutes first (MLFLOW_HTTP_REQUEST_MAX_RETRIES,
    7 with backoff, in 3.x). Through requests, as MLflow's client goes (credentials in the URL included)."""
    import requests  # MLflow's own dependency: there whenever MLflow is

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S)
    except requests.RequestException as e:  # refused, timeout, reset, a URL it cannot read
        raise MLflowUnavailable(
            f"MLflow at {shown(uri)} does not answer ({e}); check mlflow_uri or start the server"
        ) from e


def _param(value: Any) -> str:
    """A settings value as an MLflow param (a string of at most 6,000 characters)."""
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text[:6000]


def _artifacts_beside(uri: str, experiment: str) -> str | None:
    """Where a local store's artifacts go (next to it); None for a server, which has its own."""
    for scheme in ("sqlite:///", "file:"):
        if uri.startswith(scheme):
            store = Path(uri[len(scheme) :]).expanduser().resolve()
            folder = store.parent if scheme == "sqlite:///" else store
            return (folder / "mlartifacts" / experiment).as_uri()
    return None
