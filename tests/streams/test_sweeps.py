"""Sweeps against a real Redis: overdue spent entries reach the dead letters with no consumer alive;
idle consumers are removed only when they hold nothing."""

from __future__ import annotations

import time

from streams import sweeps
from streams.codec import decode
from streams.keys import VERIFIERS
from streams.publisher import Publisher
from streams.runtime import ConsumerSettings, ensure_group
from streams.schema import Attempt, DeadLetter

from .test_runtime import attempt

SETTINGS = ConsumerSettings(claim_idle_ms=50, retry_delay_ms=10, max_deliveries=2)


async def _deliver(redis, keys, consumer: str, count: int) -> None:
    await redis.xreadgroup(VERIFIERS, consumer, {keys.attempts: ">"}, count=count)


async def _wait_idle(redis, keys, ms: int) -> None:
    deadline = time.monotonic() + 5
    while True:  # polls Redis's own idle counter: the condition the sweep acts on
        rows = await redis.xpending_range(keys.attempts, VERIFIERS, min="-", max="+", count=10, idle=ms)
        if rows:
            return
        assert time.monotonic() < deadline


async def test_spent_overdue_entry_is_dead_lettered_and_fresh_one_is_left(redis, keys):
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish([attempt(0), attempt(1)])
    await _deliver(redis, keys, "crashed-1", 1)  # a0: first delivery
    await redis.xclaim(keys.attempts, VERIFIERS, "crashed-2", 0, [(await redis.xrange(keys.attempts))[0][0]])
    await _deliver(redis, keys, "crashed-1", 1)  # a1: one delivery only
    await _wait_idle(redis, keys, SETTINGS.claim_idle_ms)
    assert await sweeps.dead_letter_overdue(redis, keys, keys.attempts, VERIFIERS, SETTINGS) == 1
    [(_, fields)] = await redis.xrange(keys.dlq)
    letter = decode(DeadLetter, fields)
    assert decode(Attempt, letter.original).attempt_id == "a0" and letter.deliveries == 2
    assert (letter.reason, letter.consumer) == ("delivered 2 times (max 2), found by the sweep", sweeps.SWEEPER)
    pending = await redis.xpending(keys.attempts, VERIFIERS)
    assert pending["pending"] == 1  # a1 still has a delivery left: not the sweep's to take


async def test_idle_consumers_without_pending_are_removed(redis, keys):
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish([attempt(0)])
    await _deliver(redis, keys, "holder", 1)
    await redis.xgroup_createconsumer(keys.attempts, VERIFIERS, "empty")
    await _wait_idle(redis, keys, 20)
    removed = await sweeps.remove_idle_consumers(redis, keys.attempts, VERIFIERS, idle_ms=10)
    assert removed == ["empty"]
    names = [c["name"] for c in await redis.xinfo_consumers(keys.attempts, VERIFIERS)]
    assert names == [b"holder"]
