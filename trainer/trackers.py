"""What the trackers (TensorBoard, trainer/tensorboard_log.py; MLflow, trainer/mlflow_run.py) log of a
metrics.jsonl record, and how one that missed records (a trainer killed between the writes) catches up."""

from __future__ import annotations

from typing import Any

NESTED = ("parts", "held_out_parts", "member_spread")  # figures kept as objects, logged one number a key


def tracked(record: dict[str, Any]) -> tuple[dict[str, float], int]:
    """What a tracker logs of a record: its numbers (not flags, not the version or time), those of its
    `NESTED` objects as `<object>/<key>` (Countdown's credit by part: `parts/format`, `held_out_parts/solved`),
    evaluations under `eval/`, and the step, which is the version."""
    prefix = "eval/" if record.get("eval") else ""
    flat = {k: v for k, v in record.items() if k not in NESTED}
    for name in NESTED:
        if isinstance(record.get(name), dict):
            flat |= {f"{name}/{k}": v for k, v in record[name].items()}
    numbers = {
        prefix + k: float(v)
        for k, v in flat.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and k not in ("version", "time")
    }
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
