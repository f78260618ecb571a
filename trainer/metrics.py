"""What a user watches: per-version metrics as JSONL in the run directory (the same objects go to the
`{ps:R}:metrics` stream, which `python -m ops tail metrics --follow` shows live), pipeline figures read
from the workers' stats hashes, PNG plots at the end; TensorBoard scalars when it is installed, and an MLflow
run when `mlflow_uri` names a tracking store (`MLflowRun`: settings as params, every version's numbers with
step = version, evaluations under `eval/`, plots and report.json as artifacts, the same MLflow run continued
when the trainer restarts)."""

from __future__ import annotations

import importlib.util
import time
import urllib.parse
from pathlib import Path
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from streams import letters
from streams.groups import group_states
from streams.keys import GENERATORS, VERIFIERS, Keys
from trainer.plots import pyplot, save

# Each figure's colour in the plots (matplotlib's tab10, the colours its default cycle gave them), and on the
# dashboard, which takes them from here (ops/views/dashboard.py): one figure, one colour, everywhere.
COLORS = {"reward_mean": "#1f77b4", "pass_rate": "#ff7f0e", "held_out_reward": "#2ca02c",
          "held_out_exact": "#d62728", "rewards_per_s": "#1f77b4", "generator_tokens_per_s": "#ff7f0e"}  # fmt: skip
DLQ_SCAN = 1_000  # the newest dead letters counted by reason in each version's metrics (the total is XLEN)
MLFLOW_RETRY_S = 60.0  # after MLflow failed mid-run, its next try waits this long (metrics.jsonl has it all)
log = structlog.get_logger("trainer.metrics")


def read_records(path: Path) -> list[dict[str, Any]]:
    """A metrics.jsonl's records, in the order written (none if it does not exist)."""
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def update_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of policy updates (one a version), without the evaluations."""
    return [r for r in records if not r.get("eval") and "version" in r]


def tracked(record: dict[str, Any]) -> tuple[dict[str, float], int]:
    """What a tracker logs of a record: its numbers (not flags, not the version or time), evaluations under
    `eval/`, and the step, which is the version."""
    prefix = "eval/" if record.get("eval") else ""
    numbers = {prefix + k: float(v) for k, v in record.items()
               if isinstance(v, int | float) and not isinstance(v, bool) and k not in ("version", "time")}  # fmt: skip
    return numbers, int(record.get("version", 0))


CAUGHT_UP_BY = ("reward_mean", "eval/held_out_reward")  # a tracker has a record when it has this at its step


def log_missing(log_metrics, records: list[dict[str, Any]], logged: dict[str, set[int]]) -> int:
    """Give `log_metrics` the records whose key (`reward_mean` for an update, `eval/held_out_reward` for an
    evaluation) it has not logged at the record's version (`logged`: key -> steps); how many."""
    missing = 0
    for record in records:
        numbers, step = tracked(record)
        key = CAUGHT_UP_BY[1] if record.get("eval") else CAUGHT_UP_BY[0]
        if key in numbers and step not in logged[key]:
            log_metrics(numbers, step)
            missing += 1
    return missing


class MetricsSink:
    """metrics.jsonl, the record of the run, and the trackers fed from it. MLflow failing mid-run (its server
    away, its store refusing) never stops or fails the training: the sink says so once, tries again at most
    every `retry_s`, and then logs what MLflow missed from metrics.jsonl (`catch_up`); at the end it tries
    once more, and a resume catches up too."""

    def __init__(self, run_dir: Path, mlflow: MLflowRun | None = None, retry_s: float = MLFLOW_RETRY_S) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self._tensorboard = _tensorboard(run_dir)
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
            log.warning("mlflow_unavailable", uri=self.mlflow.shown_uri, error=f"{type(e).__name__}: {e}"[:500],
                        retry_s=self.retry_s, record=str(self.path))  # fmt: skip
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

    async def pipeline_figures(self, redis: Redis, keys: Keys) -> dict[str, Any]:
        """Lags, the oldest pending entry of each group, dead letters by reason, verifier utilization and generator
        throughput, as the workers last reported."""
        out: dict[str, Any] = {"dead_letters": await redis.xlen(keys.dlq),
                               "dead_letters_by_reason": await letters.by_reason(redis, keys, DLQ_SCAN)}  # fmt: skip
        idle: dict[str, int | None] = {}
        for name, stream in keys.streams().items():
            for g in await group_states(redis, stream):
                idle[f"{name}/{g.name}"] = g.oldest_pending_idle_ms
                if (name, g.name) in (("work", GENERATORS), ("attempts", VERIFIERS)):
                    out[f"{name}_outstanding"] = g.outstanding
        out["oldest_pending_idle_ms"] = idle
        verifiers = [orjson.loads(v) for v in (await redis.hvals(keys.verifier_stats))]
        if verifiers:
            out["verifier_utilization"] = round(sum(v.get("utilization", 0.0) for v in verifiers) / len(verifiers), 4)
        generators = [orjson.loads(v) for v in (await redis.hvals(keys.generator_stats))]
        if generators:
            out["generator_tokens_per_s"] = round(
                sum(g.get("engine_stats", {}).get("tokens_per_s", 0.0) for g in generators), 1
            )
            out["generator_busy_share"] = round(sum(g.get("busy_share", 0.0) for g in generators) / len(generators), 3)
            out["stale_orders_skipped"] = sum(g.get("stale_skipped", 0) for g in generators)
        return out

    def plots(self) -> list[Path]:
        """reward.png, staleness.png, throughput.png from metrics.jsonl. [] when matplotlib is missing."""
        if (plt := pyplot()) is None:
            log.warning("no_plots", reason="matplotlib is not installed")
            return []
        records = self.records()
        updates = update_records(records)
        evals = [r for r in records if r.get("eval")]
        out = []

        fig, ax = plt.subplots(figsize=(7, 4))
        if updates:
            v = [r["version"] for r in updates]
            ax.plot(v, [r["reward_mean"] for r in updates], marker="o", color=COLORS["reward_mean"],
                    label="members' mean reward (train)")  # fmt: skip
            ax.plot(v, [r["pass_rate"] for r in updates], marker=".", color=COLORS["pass_rate"],
                    label="members' exact success (train)")  # fmt: skip
        if evals:
            ax.plot([r["version"] for r in evals], [r["held_out_reward"] for r in evals], marker="s",
                    color=COLORS["held_out_reward"], label="held-out reward (greedy center)")  # fmt: skip
            ax.plot([r["version"] for r in evals], [r["held_out_exact"] for r in evals], marker="^",
                    color=COLORS["held_out_exact"], label="held-out exact success (greedy center)")  # fmt: skip
        ax.set_xlabel("policy version")
        ax.set_ylabel("reward")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        out.append(save(fig, self.run_dir / "reward.png"))

        fig, ax = plt.subplots(figsize=(7, 4))
        lags = sorted({int(k) for r in updates for k in r.get("staleness", {})})
        bottom = [0] * len(updates)
        for lag in lags:
            counts = [r.get("staleness", {}).get(str(lag), 0) for r in updates]
            ax.bar([r["version"] for r in updates], counts, bottom=bottom, label=f"{lag} version(s) old")
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
        ax.set_xlabel("policy version")
        ax.set_ylabel("members used")
        ax.set_title("staleness of the members each update used")
        if lags:
            ax.legend(fontsize=8)
        out.append(save(fig, self.run_dir / "staleness.png"))

        fig, ax = plt.subplots(figsize=(7, 4))
        if updates:
            v = [r["version"] for r in updates]
            ax.plot(v, [r.get("rewards_per_s", 0) for r in updates], marker="o", color=COLORS["rewards_per_s"],
                    label="rewards/s")  # fmt: skip
            if any("generator_tokens_per_s" in r for r in updates):
                ax2 = ax.twinx()
                ax2.plot(v, [r.get("generator_tokens_per_s", 0) for r in updates], marker=".",
                         color=COLORS["generator_tokens_per_s"], label="generated tokens/s")  # fmt: skip
                ax2.set_ylabel("tokens/s")
                ax2.legend(loc="lower right", fontsize=8)
        ax.set_xlabel("policy version")
        ax.set_ylabel("rewards/s")
        ax.legend(loc="upper left", fontsize=8)
        out.append(save(fig, self.run_dir / "throughput.png"))
        return out


def _tensorboard(run_dir: Path) -> TensorBoardLog | None:
    """TensorBoard scalars in `run_dir/tensorboard`, or None when TensorBoard (or torch) is not installed."""
    if importlib.util.find_spec("tensorboard") is None or importlib.util.find_spec("torch") is None:
        return None
    return TensorBoardLog(run_dir / "tensorboard")


class TensorBoardLog:
    """`log(metrics, step)` as TensorBoard scalars (torch's SummaryWriter: an event file per trainer start)."""

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # torch: heavy, and only here

        self.folder = folder
        self.writer = SummaryWriter(str(folder))

    def __call__(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def catch_up(self, records: list[dict[str, Any]]) -> int:
        """Log the records the event files lack (as MLflowRun.catch_up: by `reward_mean` or
        `eval/held_out_reward` at the record's version), read with TensorBoard's own reader; how many."""
        from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

        events = EventAccumulator(str(self.folder), size_guidance={SCALARS: 0})  # 0: every step, not a sample
        events.Reload()
        tags = set(events.Tags()["scalars"])
        logged = {key: {e.step for e in events.Scalars(key)} if key in tags else set() for key in CAUGHT_UP_BY}
        return log_missing(self, records, logged)


class MLflowUnavailable(RuntimeError):
    """`mlflow_uri` is set but MLflow cannot be used (not installed, or the store refuses)."""


RECORD = "mlflow.json"  # in the run directory: which MLflow run this run logs to


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
            experiment_id = found.experiment_id if found is not None else self.client.create_experiment(
                experiment, artifact_location=_artifacts_beside(uri, experiment))  # fmt: skip
            tags = {"proofstream.run": str(params.get("run", "")), "proofstream.run_dir": str(run_dir.resolve())}
            self.run_id = self.client.create_run(experiment_id, run_name=str(params.get("run") or run_dir.name),
                                                 tags=tags).info.run_id  # fmt: skip
            self.client.log_batch(self.run_id, params=[Param(k, _param(v)) for k, v in sorted(params.items())],
                                  tags=[RunTag("mlflow.source.name", "python -m trainer")])  # fmt: skip
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
