"""streams/reclaim.py against a real Redis (7.x and 6.2): what a pass takes over, in what order, with which
delivery count, and what it leaves alone. The consumer's use of it (one entry handled and settled before the
next is claimed) is tested through `Consumer` in test_runtime.py."""

from __future__ import annotations

import asyncio
import time

from streams.keys import VERIFIERS
from streams.publisher import Publisher
from streams.reclaim import Reclaim
from streams.runtime import ensure_group

from .test_runtime import attempt

IDLE_MS = 100


def reclaim(redis, keys, name: str = "live", every_ms: int = 0) -> Reclaim:
    return Reclaim(redis, keys.attempts, VERIFIERS, name, idle_ms=IDLE_MS, every_ms=every_ms, page=100)


async def left_by_a_dead_consumer(redis, keys, n: int) -> list[bytes]:
    """`n` attempts read by consumer "dead" (one delivery each) and idle past the deadline; their entry ids."""
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish([attempt(i) for i in range(n)])
    await redis.xreadgroup(VERIFIERS, "dead", {keys.attempts: ">"}, count=n)
    ids = [eid for eid, _ in await redis.xrange(keys.attempts)]
    deadline = time.monotonic() + 5
    while True:  # Redis's own idle counter is the condition a pass acts on
        rows = await redis.xpending_range(keys.attempts, VERIFIERS, min="-", max="+", count=n, idle=IDLE_MS)
        if len(rows) == n:
            return ids
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def owners(redis, keys) -> dict[bytes, tuple[bytes, int]]:
    rows = await redis.xpending_range(keys.attempts, VERIFIERS, min="-", max="+", count=100)
    return {r["message_id"]: (r["consumer"], r["times_delivered"]) for r in rows}


async def taken(pass_) -> list:
    return [entry async for entry in pass_]


async def test_a_pass_takes_over_overdue_entries_in_order_with_redis_delivery_counts(redis, keys):
    ids = await left_by_a_dead_consumer(redis, keys, 3)
    await redis.xclaim(keys.attempts, VERIFIERS, "busy", 0, [ids[1]])  # just delivered again: not overdue
    got = await taken(reclaim(redis, keys).one_by_one(asyncio.Event(), limit=10))
    assert [(eid, fields[b"attempt_id"], n) for eid, fields, n in got] == [(ids[0], b"a0", 2), (ids[2], b"a2", 2)]
    assert await owners(redis, keys) == {ids[0]: (b"live", 2), ids[1]: (b"busy", 2), ids[2]: (b"live", 2)}


async def test_each_entry_is_claimed_only_when_the_consumer_asks_for_the_next(redis, keys):
    """One at a time: while the consumer works on the first, the second is still the dead consumer's, with
    the delivery count it had; a pass stops at its limit, and the next pass goes on from there."""
    ids = await left_by_a_dead_consumer(redis, keys, 3)
    r = reclaim(redis, keys)
    one_by_one = r.one_by_one(asyncio.Event(), limit=2)
    first = await anext(one_by_one)
    assert first[0] == ids[0]
    assert (await owners(redis, keys))[ids[1]] == (b"dead", 1)
    assert [entry[0] for entry in await taken(one_by_one)] == [ids[1]]  # the limit: two a pass
    assert (await owners(redis, keys))[ids[2]] == (b"dead", 1)
    assert [entry[0] for entry in await taken(r.one_by_one(asyncio.Event(), limit=2))] == [ids[2]]


async def test_a_stopped_consumer_claims_nothing(redis, keys):
    ids = await left_by_a_dead_consumer(redis, keys, 2)
    stop = asyncio.Event()
    stop.set()
    assert await taken(reclaim(redis, keys).one_by_one(stop, limit=10)) == []
    assert await owners(redis, keys) == {eid: (b"dead", 1) for eid in ids}


async def test_an_entry_deleted_while_pending_is_skipped_and_leaves_nothing_pending(redis, keys):
    """Trimmed or deleted under a dead consumer: Redis 7 drops it from the pending list as it claims; 6.2
    answers a nil in its place and keeps it pending, and the pass acks it."""
    ids = await left_by_a_dead_consumer(redis, keys, 3)
    await redis.xdel(keys.attempts, ids[1])
    got = await taken(reclaim(redis, keys).one_by_one(asyncio.Event(), limit=10))
    assert [entry[0] for entry in got] == [ids[0], ids[2]]
    assert set(await owners(redis, keys)) == {ids[0], ids[2]}


def test_passes_come_at_most_every_every_ms_unless_one_is_asked_for_soon():
    r = Reclaim(None, "s", VERIFIERS, "c", idle_ms=IDLE_MS, every_ms=60_000, page=10)  # pacing alone: no Redis
    assert r.due()
    assert not r.due()  # the next pass is a minute away
    r.soon()
    assert r.due() and not r.due()
