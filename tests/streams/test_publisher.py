"""Backpressure from the reading group's outstanding work, and trimming only what every group acked."""

from __future__ import annotations

import asyncio

import pytest

from streams.groups import group_states, trim_acked
from streams.keys import VERIFIERS
from streams.publisher import Backpressure, Publisher
from streams.runtime import Consumer, ConsumerSettings, ensure_group
from streams.schema import Attempt, Reward

from .test_runtime import attempt, reward_for


async def test_fast_producer_is_held_at_the_bound_until_the_group_catches_up(redis, keys):
    await ensure_group(redis, keys.attempts, VERIFIERS)
    pub = Publisher(redis, keys, group=VERIFIERS, max_outstanding=40, poll_ms=5)
    for b in range(4):
        await pub.publish([attempt(b * 10 + i) for i in range(10)], wait_s=1)
    with pytest.raises(Backpressure, match="owes 40 entries"):
        await pub.publish([attempt(99)], wait_s=0.2)
    assert await redis.xlen(keys.attempts) == 40  # nothing was written past the bound, nothing dropped

    # A slow consumer drains; a producer of 200 more never has more than bound + one batch outstanding.
    stop = asyncio.Event()
    c = Consumer(
        redis,
        keys,
        message_type=Attempt,
        group=VERIFIERS,
        name="slow",
        handler=_slowly,
        output=Reward,
        settings=ConsumerSettings(batch_size=5, block_ms=20),
    )
    consumer_task = asyncio.create_task(c.run(stop))
    worst = 0
    for b in range(20):
        await pub.publish([attempt(1000 + b * 10 + i) for i in range(10)], wait_s=30)
        worst = max(worst, await pub.outstanding(keys.attempts))
    stop.set()
    await consumer_task
    assert worst <= 40 + 10
    assert pub.held_s > 0
    assert await redis.xlen(keys.attempts) == 240


async def _slowly(d):
    await asyncio.sleep(0.002)  # a handler that does work: slower than the producer
    return reward_for(d)


async def test_group_states_report_lag_and_pending(redis, keys):
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish([attempt(i) for i in range(10)])
    await redis.xreadgroup(VERIFIERS, "c", {keys.attempts: ">"}, count=4)
    [g] = await group_states(redis, keys.attempts)
    assert (g.name, g.pending, g.lag, g.consumers, g.outstanding) == (VERIFIERS, 4, 6, 1, 10)
    assert g.oldest_pending_idle_ms is not None and g.oldest_pending_id is not None


async def test_trim_keeps_pending_and_unread_entries(redis, keys):
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await ensure_group(redis, keys.attempts, "audit")
    ids = await Publisher(redis, keys).publish([attempt(i) for i in range(10)])
    got = await redis.xreadgroup(VERIFIERS, "c", {keys.attempts: ">"}, count=6)
    read = [eid for eid, _ in got[0][1]]
    await redis.xack(keys.attempts, VERIFIERS, *read[:2], *read[3:])  # entry 2 stays pending
    await redis.xreadgroup("audit", "c", {keys.attempts: ">"}, count=8)
    await redis.xack(keys.attempts, "audit", *ids[:8])
    assert await trim_acked(redis, keys.attempts) == 2  # entries 0 and 1: acked by both groups
    remaining = [eid for eid, _ in await redis.xrange(keys.attempts)]
    assert remaining == ids[2:]


async def test_trim_leaves_a_stream_without_groups_alone(redis, keys):
    await Publisher(redis, keys).publish([attempt(i) for i in range(3)])
    assert await trim_acked(redis, keys.attempts) == 0
    assert await redis.xlen(keys.attempts) == 3


async def test_trim_keeps_the_last_seconds_of_acked_history(redis, keys):
    """Entries stamped an hour ago and now, all acked: keep_s=600 trims the old ones only, 0 trims all."""
    await ensure_group(redis, keys.rewards, "trainer")
    seconds, _ = await redis.time()
    hour_ago_ms = (seconds - 3600) * 1000
    old = [await redis.xadd(keys.rewards, {"i": i}, id=f"{hour_ago_ms}-{i}") for i in range(3)]
    new = [await redis.xadd(keys.rewards, {"i": i}) for i in range(3, 5)]
    await redis.xreadgroup("trainer", "c", {keys.rewards: ">"})
    await redis.xack(keys.rewards, "trainer", *old, *new)
    assert await trim_acked(redis, keys.rewards, keep_s=600) == 3
    assert [eid for eid, _ in await redis.xrange(keys.rewards)] == new
    assert await trim_acked(redis, keys.rewards) == 2


async def test_register_refuses_a_record_no_verifier_could_check_and_writes_nothing(redis, keys):
    from streams.theorems import Theorem, register

    good = Theorem("ok", "lean", statement="theorem ok : True := by\n", header="import Mathlib\n")
    bad = [
        Theorem("no-by", "lean", statement="theorem t : True :="),
        Theorem("cd", "countdown", numbers=[1, "2"], target=3),  # type: ignore[list-item]
        Theorem("cd-empty", "countdown", numbers=[], target=3),
        Theorem("x", "chess"),
    ]
    for theorem in bad:
        with pytest.raises(ValueError, match=theorem.theorem_id):
            await register(redis, keys, [good, theorem])
    assert await redis.hlen(keys.theorems) == 0
    await register(redis, keys, [good, Theorem("cd", "countdown", numbers=[1, 2], target=3)])
    assert await redis.hlen(keys.theorems) == 2
