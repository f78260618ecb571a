"""The metrics a killed trainer left in Redis only: written to the run directory when the run resumes.

A trainer killed between a version's MULTI (policy, metrics stream, checkpoint: trainer/run_state.py) and its
line in metrics.jsonl left that version in Redis only, and so out of the JSONL, TensorBoard and MLflow too;
likewise an evaluation in the checkpoint.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
from redis.asyncio import Redis

from streams.keys import Keys
from streams.run_dir import eval_records, update_records
from trainer import held_out
from trainer.metrics import MetricsSink


async def backfill(
    redis: Redis, keys: Keys, sink: MetricsSink, eval_results: dict[int, dict[str, Any]], counts: Counter
) -> set[int]:
    """Write what the run directory lacks, from `{ps:R}:metrics` and the checkpoint's `eval_results`; count it
    (`metrics_backfilled`). Returns the versions whose evaluation metrics.jsonl now holds."""
    records = sink.records()
    have = {int(r["version"]) for r in update_records(records)}
    for _, fields in await redis.xrange(keys.metrics):
        metrics = orjson.loads(fields[b"json"])
        if int(metrics["version"]) not in have:
            sink.write(metrics)
            counts["metrics_backfilled"] += 1
    evals_in_jsonl = {int(r["version"]) for r in eval_records(records)}
    for version, result in sorted(eval_results.items()):
        if version not in evals_in_jsonl:
            sink.write(held_out.record(result))
            evals_in_jsonl.add(version)
            counts["metrics_backfilled"] += 1
    counts["metrics_backfilled"] += sink.catch_up()
    return evals_in_jsonl
