"""A run directory's layout: the files the trainer writes there and the tools (ops, evals) read, named once.

    <run dir>/
      run.json              INFO: the settings and start of the trainer that runs it (written at each start)
      report.json           REPORT: written at the end: settings, version, counts, evaluations, wall time
      metrics.jsonl         METRICS: one record a version (an update) or an evaluation (`"eval": true`, with each
                            problem's reward and the problems solved: streams/learned.py), in order
      reward.png, staleness.png, throughput.png, parts.png   PLOTS, drawn from metrics.jsonl at the end (parts.png:
                            Countdown's credit by part, where the records carry it)
      samples/              SAMPLES: the judged attempts, v<version>.jsonl.gz (streams/samples.py)
      logs/                 LOGS: the local pipeline's roles' logs (trainer/local.py)
      redis/                REDIS: the local pipeline's Redis data; `redis/.lock` (DATA_LOCK) is held by whoever
                            runs a server on it or copies it (streams/run_redis.py reopens it for ops and evals)
      tensorboard/, mlflow.json   TENSORBOARD, MLFLOW: the trackers (trainer/tensorboard_log.py, mlflow_run.py)
      policy/, checkpoints/ POLICY, CHECKPOINTS: GRPO's weights folders and trainer checkpoints

A folder holds a run when it has any of INFO, REPORT or METRICS (`holds_run`); the sub-folders above are parts
of a run, never runs of their own (`PARTS`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

INFO = "run.json"
REPORT = "report.json"
METRICS = "metrics.jsonl"
PLOTS = ("reward.png", "staleness.png", "throughput.png", "parts.png")
SAMPLES = "samples"
LOGS = "logs"
REDIS = "redis"
# In REDIS: held by whoever runs a server on that data (a local pipeline for its lifetime, trainer/local.py) or
# copies it (streams/run_redis.py): two servers on one AOF corrupt it, and a copy taken mid-write is torn.
DATA_LOCK = ".lock"
TENSORBOARD = "tensorboard"
MLFLOW = "mlflow.json"
POLICY = "policy"
CHECKPOINTS = "checkpoints"
PARTS = frozenset({SAMPLES, LOGS, REDIS, TENSORBOARD, POLICY, CHECKPOINTS})


def holds_run(folder: Path) -> bool:
    """The folder is a run directory: it has run.json, report.json or metrics.jsonl."""
    return any((folder / name).is_file() for name in (INFO, REPORT, METRICS))


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file (run.json, report.json, mlflow.json); None where it is missing, unreadable or not an
    object."""
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def read_records(path: Path) -> list[dict[str, Any]]:
    """A metrics.jsonl's records, in the order written (none if it does not exist). `path` is the file or the
    run directory holding it."""
    if path.is_dir():
        path = path / METRICS
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def update_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of policy updates (one a version), without the evaluations."""
    return [r for r in records if not r.get("eval") and "version" in r]


def newest_update(updates: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The update record of the highest version among `updates` (`update_records`), None where there is none."""
    return max(updates, key=lambda r: int(r["version"]), default=None)


def eval_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of held-out evaluations, in the order written."""
    return [r for r in records if r.get("eval")]
