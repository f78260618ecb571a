"""The pipeline's figures each version's metrics carry, as the workers last reported them in Redis: group
lags and oldest pending entries, dead letters by reason, verifier utilization, generator throughput."""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis

from streams import letters
from streams.groups import group_states
from streams.keys import GENERATORS, VERIFIERS, Keys

DLQ_SCAN = 1_000  # the newest dead letters counted by reason in each version's metrics (the total is XLEN)


async def pipeline_figures(redis: Redis, keys: Keys) -> dict[str, Any]:
    """Lags, the oldest pending entry of each group, dead letters by reason, verifier utilization and generator
    throughput, as the workers last reported."""
    out: dict[str, Any] = {
        "dead_letters": await redis.xlen(keys.dlq),
        "dead_letters_by_reason": await letters.by_reason(redis, keys, DLQ_SCAN),
    }
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
