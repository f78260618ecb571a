"""The roles' own figures: `{ps:R}:generator_stats` and `{ps:R}:verifier_stats`, one hash each.

Each field is one process (a generator by its name, a verifier worker by its id) and its value that process's
latest figures as one JSON object, written every few seconds and at its stop. Readers are the trainer's
metrics and progress watch, `python -m ops` (inspect, dashboard, health) and evals. Like streams/schema.py for
the streams, this module is the one place that writes and reads them; the classes below name every field a
reader may rely on (a process may add more, e.g. its own counters). Plain `redis-cli HGETALL` shows the same.
"""

from __future__ import annotations

import time
from typing import Any, TypedDict

import orjson
import redis
from redis.asyncio import Redis

from streams.keys import Keys


class EngineStats(TypedDict, total=False):
    tokens_per_s: float  # new tokens a second over the engine's generate calls


class GeneratorStats(TypedDict, total=False):
    """A generator process (producers/service.py `figures`): its counters are merged in at the top level
    (`attempts`, `stale_skipped`, ...), and its consumer's wire counters as `wire_<name>`."""

    name: str
    engine: str  # hf | vllm
    policy_latest: int  # the newest policy version it has applied
    policy_rewinds: int  # times a failover rewrote the policy history under it
    fatal: str | None  # why it stopped serving; the trainer's progress watch names it
    orders: int  # work orders generated for
    attempts: int  # attempts published, evaluation orders' included
    stale_skipped: int  # work orders skipped as too stale
    settled_skipped: int  # work orders skipped as settled already, or cut by the trainer
    policy_errors: int  # work orders whose policy did not match the weights (dead-lettered)
    held_for_room_s: float  # seconds held back because the attempts stream's lag was over its bound
    busy_share: float  # share of its uptime spent generating
    engine_stats: EngineStats
    reported_ms: int  # when these figures were written (ms since the epoch)


class VerifierStats(TypedDict, total=False):
    """A verifier worker process (consumers/service.py `stats`)."""

    worker: str
    slots: int
    consumers: int
    processed: int
    published: int
    dead_letters: int
    transient_failures: int
    settle_unreplicated: int
    utilization: float  # busy share of its sandbox slots over its uptime
    sandboxes: int
    sandbox_starts: int
    sandbox_timeouts: int
    sandbox_crashes: int
    sandboxes_unavailable: dict[str, str]  # sandbox -> why it cannot start (red in `ops.health verifier`)
    updated_ms: int  # when these figures were written (ms since the epoch)


# The field each role stamps its report with: the two roles name it differently, and readers rely on both.
WRITTEN_AT = {"generator": "reported_ms", "verifier": "updated_ms"}


def _decode(raw: dict[bytes, bytes]) -> dict[str, dict[str, Any]]:
    return {(k.decode() if isinstance(k, bytes) else k): orjson.loads(v) for k, v in raw.items()}


async def generators(redis_client: Redis, keys: Keys) -> dict[str, GeneratorStats]:
    """Every generator's latest figures, by name."""
    return _decode(await redis_client.hgetall(keys.generator_stats))  # type: ignore[return-value]


async def verifiers(redis_client: Redis, keys: Keys) -> dict[str, VerifierStats]:
    """Every verifier worker's latest figures, by worker id."""
    return _decode(await redis_client.hgetall(keys.verifier_stats))  # type: ignore[return-value]


def generators_sync(client: redis.Redis, keys: Keys) -> dict[str, GeneratorStats]:
    return _decode(client.hgetall(keys.generator_stats))  # type: ignore[return-value]


def verifiers_sync(client: redis.Redis, keys: Keys) -> dict[str, VerifierStats]:
    return _decode(client.hgetall(keys.verifier_stats))  # type: ignore[return-value]


async def publish_generator(redis_client: Redis, keys: Keys, name: str, figures: GeneratorStats) -> None:
    await redis_client.hset(keys.generator_stats, name, orjson.dumps(figures))


async def publish_verifier(redis_client: Redis, keys: Keys, worker: str, figures: VerifierStats) -> None:
    await redis_client.hset(keys.verifier_stats, worker, orjson.dumps(figures))


def age_s(role: str, report: dict[str, Any], now_ms: float | None = None) -> float:
    """Seconds since `report` (a `role`'s: generator or verifier) was written; a report without its stamp is
    as old as the epoch."""
    now_ms = time.time() * 1000 if now_ms is None else now_ms
    return (now_ms - report.get(WRITTEN_AT[role], 0)) / 1000
