"""Periodic housekeeping of a consumer group, run by a scheduler (the verifier pool's arq cron jobs):

- dead letters: an entry idle past its deadline and already delivered `max_deliveries` times is moved to
  the dead letters even when no consumer is alive to reclaim it (e.g. it crashed every consumer);
- dead consumers: consumers with nothing pending and idle for long are removed from the group, so
  `XINFO CONSUMERS` shows the live pool;
- trimming: history every group has acked is deleted (MINID, never MAXLEN).

Each sweep is safe to run from several workers at once: claims and the settle script are atomic.
"""

from __future__ import annotations

import structlog
from redis.asyncio import Redis

from streams.groups import trim_acked
from streams.keys import Keys
from streams.letters import letter, too_often
from streams.runtime import ConsumerSettings
from streams.settle import Settlement, Settler

log = structlog.get_logger("streams.sweeps")

SWEEPER = "sweeper"  # the consumer name sweeps claim under; removed again by `remove_idle_consumers`


async def dead_letter_overdue(redis: Redis, keys: Keys, stream: str, group: str, settings: ConsumerSettings) -> int:
    """Move overdue entries that used up their deliveries to the dead letters. Returns how many."""
    rows = await redis.xpending_range(stream, group, min="-", max="+", count=1000, idle=settings.claim_idle_ms)
    spent = [r for r in rows if r["times_delivered"] >= settings.max_deliveries]
    if not spent:
        return 0
    # Claiming first makes the move safe against a consumer reclaiming the same entry right now.
    claimed = await redis.xclaim(stream, group, SWEEPER, settings.claim_idle_ms, [r["message_id"] for r in spent])
    counts = {r["message_id"]: r["times_delivered"] for r in spent}
    settlement = Settlement(keys, stream, stream, group, settings.dedup_ttl_s)
    for entry_id, fields in claimed:
        if fields is None:  # deleted meanwhile (Redis 6.2 shape)
            continue
        reason = f"{too_often(counts[entry_id], settings.max_deliveries)}, found by the sweep"
        settlement.dead(entry_id, letter(stream, group, SWEEPER, entry_id, fields, counts[entry_id], reason))
    settled = await Settler(redis)(settlement)
    if settled.dead:
        log.warning("sweep_dead_lettered", stream=stream, group=group, count=settled.dead)
    return settled.dead


async def remove_idle_consumers(redis: Redis, stream: str, group: str, idle_ms: int) -> list[str]:
    """Delete consumers that hold nothing and were idle longer than `idle_ms`."""
    removed = []
    for c in await redis.xinfo_consumers(stream, group):
        name = c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
        if c["pending"] == 0 and c["idle"] > idle_ms:
            await redis.xgroup_delconsumer(stream, group, name)
            removed.append(name)
    if removed:
        log.info("sweep_removed_consumers", stream=stream, group=group, consumers=removed)
    return removed


async def trim(redis: Redis, stream: str, keep_s: float = 0.0) -> int:
    n = await trim_acked(redis, stream, keep_s=keep_s)
    if n:
        log.info("sweep_trimmed", stream=stream, deleted=n)
    return n
