"""MLflow for real: a trainer's metrics sink logging to a real SQLite tracking store (MLflow's own client
reads it back): the settings as params, every version's numbers with step = version, evaluations under
eval/, the report and plots as artifacts beside the store, and a restarted trainer continuing the same run."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import orjson
import pytest

from streams.run_dir import read_records
from trainer.config import TrainerSettings
from trainer.metrics import MetricsSink
from trainer.mlflow_run import RECORD, MLflowRun, MLflowUnavailable

mlflow = pytest.importorskip("mlflow")


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, pytest.approx(m.value)) for m in client.get_metric_history(run_id, key)]


def test_a_run_logs_params_metrics_and_artifacts_and_a_restart_continues_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # artifacts must not land in the working directory (MLflow's default ./mlruns)
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    run_dir = tmp_path / "runs" / "exp-1"
    settings = TrainerSettings(run="exp-1", population=6, sigma=0.002, mlflow_uri=uri)
    params = settings.model_dump(exclude={"redis_url"})
    sink = MetricsSink(run_dir, MLflowRun(run_dir, uri, "proofstream-test", params))
    sink.write({"version": 1, "reward_mean": 0.25, "pass_rate": 0.0, "algo": "es", "time": 1.0})
    sink.write({"version": 2, "reward_mean": 0.5, "pass_rate": 0.125, "algo": "es", "time": 2.0})
    sink.write({"eval": True, "version": 2, "held_out_reward": 0.75, "problems": 4, "time": 3.0})
    report = run_dir / "report.json"
    report.write_bytes(orjson.dumps({"version": 2}))
    plot = run_dir / "reward.png"
    plot.write_bytes(b"\x89PNG fake")
    sink.finish([report, plot], interrupted=True)  # stopped by Ctrl-C: resumed below

    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run_id = orjson.loads((run_dir / RECORD).read_bytes())["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["proofstream.run"] == "exp-1"
    assert client.get_experiment(run.info.experiment_id).name == "proofstream-test"
    assert run.data.params["population"] == "6" and run.data.params["sigma"] == "0.002"
    assert run.data.params["algo"] == "es" and "redis_url" not in run.data.params
    assert _history(client, run_id, "reward_mean") == [(1, 0.25), (2, 0.5)]
    assert _history(client, run_id, "eval/held_out_reward") == [(2, 0.75)]
    assert not set(run.data.metrics) & {"version", "time", "algo", "eval/eval"}
    assert sorted(a.path for a in client.list_artifacts(run_id)) == ["report.json", "reward.png"]
    stored = Path(client.download_artifacts(run_id, "report.json", str(tmp_path / "down")))
    assert orjson.loads(stored.read_bytes()) == {"version": 2}
    assert (tmp_path / "store" / "mlartifacts").is_dir() and not (tmp_path / "mlruns").exists()

    again = MLflowRun(run_dir, uri, "proofstream-test", {**params, "population": 99})  # a restart, new flags
    assert again.resumed and again.run_id == run_id and client.get_run(run_id).info.status == "RUNNING"
    MetricsSink(run_dir, again).write({"version": 3, "reward_mean": 0.625, "time": 4.0})
    again.finish([], interrupted=False)
    assert _history(client, run_id, "reward_mean") == [(1, 0.25), (2, 0.5), (3, 0.625)]
    finished = client.get_run(run_id)
    assert finished.info.status == "FINISHED" and finished.data.params["population"] == "6"  # params once
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_another_store_starts_a_new_mlflow_run(tmp_path):
    run_dir = tmp_path / "run"
    first = MLflowRun(run_dir, f"sqlite:///{tmp_path / 'a.db'}", "e", {"run": "r"})
    second = MLflowRun(run_dir, f"sqlite:///{tmp_path / 'b.db'}", "e", {"run": "r"})
    assert not second.resumed and second.run_id != first.run_id


def test_a_restart_logs_what_a_killed_trainer_wrote_to_the_jsonl_but_not_to_mlflow(tmp_path):
    # The trainer writes metrics.jsonl, then the trackers: a SIGKILL in between leaves a version out of MLflow.
    run_dir, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'm.db'}"
    first = MLflowRun(run_dir, uri, "e", {"run": "r"})
    MetricsSink(run_dir, first).write({"version": 1, "reward_mean": 0.1})
    MetricsSink(run_dir).write({"version": 2, "reward_mean": 0.2})  # the JSONL only: killed before MLflow
    MetricsSink(run_dir).write({"eval": True, "version": 2, "held_out_reward": 0.3})
    again = MetricsSink(run_dir, MLflowRun(run_dir, uri, "e", {"run": "r"}))
    assert again.catch_up() == 2 and again.catch_up() == 0  # logged once
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    assert _history(client, first.run_id, "reward_mean") == [(1, 0.1), (2, 0.2)]
    assert _history(client, first.run_id, "eval/held_out_reward") == [(2, 0.3)]


def test_a_store_that_fails_mid_run_fails_no_write_and_gets_what_it_missed_once_back(tmp_path):
    """MLflow refusing mid-run (here its real SQLite store, locked by another writer: "database is locked")
    must not stop the training: every write lands in metrics.jsonl and returns; once the store takes writes
    again, the versions it missed are logged from there, each once, and the run is ended."""
    run_dir, db = tmp_path / "run", tmp_path / "m.db"
    uri = f"sqlite:///{db}"
    sink = MetricsSink(run_dir, MLflowRun(run_dir, uri, "e", {"run": "r"}), retry_s=0)
    sink.write({"version": 1, "reward_mean": 0.1})
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # no one else reads or writes until it ends
    try:
        sink.write({"version": 2, "reward_mean": 0.2})  # MLflow's store waits ~20 s for the lock, then refuses
        assert sink.mlflow_behind
    finally:
        blocker.rollback()
        blocker.close()
    sink.write({"eval": True, "version": 2, "held_out_reward": 0.3})  # catches up version 2, then this
    assert not sink.mlflow_behind
    sink.write({"version": 3, "reward_mean": 0.4})
    sink.finish([], interrupted=False)
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    run_id = sink.mlflow.run_id
    assert _history(client, run_id, "reward_mean") == [(1, 0.1), (2, 0.2), (3, 0.4)]
    assert _history(client, run_id, "eval/held_out_reward") == [(2, 0.3)]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert [r["version"] for r in read_records(run_dir / "metrics.jsonl")] == [1, 2, 2, 3]


def test_a_store_still_away_at_the_end_leaves_the_run_to_a_resume(tmp_path):
    run_dir, db = tmp_path / "run", tmp_path / "m.db"
    sink = MetricsSink(run_dir, MLflowRun(run_dir, f"sqlite:///{db}", "e", {"run": "r"}), retry_s=3600)
    sink.write({"version": 1, "reward_mean": 0.1})
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        sink.finish([], interrupted=False)  # said, not raised
        assert sink.mlflow_behind
    finally:
        blocker.rollback()
        blocker.close()
    again = MetricsSink(run_dir, MLflowRun(run_dir, f"sqlite:///{db}", "e", {"run": "r"}))
    assert again.mlflow.resumed and again.catch_up() == 0  # version 1 went in before the lock


def test_a_tracking_server_that_does_not_answer_is_refused_at_once(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MLflowUnavailable, match=f"MLflow at http://127.0.0.1:{port} does not answer"):
        MLflowRun(tmp_path / "run", f"http://127.0.0.1:{port}", "e", {"run": "r"})
    with pytest.raises(MLflowUnavailable) as refused:  # credentials in the URL: read, and not shown
        MLflowRun(tmp_path / "run", f"http://me:s3cret@127.0.0.1:{port}", "e", {"run": "r"})
    assert f"MLflow at http://me:***@127.0.0.1:{port} does not answer" in str(refused.value)
    assert "s3cret" not in str(refused.value)
