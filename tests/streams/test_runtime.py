"""The consumer-group runtime against a real Redis (7.x and 6.2): exactly-once effect, reclaim, dead
letters, classification of failures, graceful release."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from streams.codec import decode, encode
from streams.groups import group_states
from streams.keys import VERIFIERS
from streams.publisher import Publisher
from streams.runtime import Consumer, ConsumerSettings, Delivery, Poison
from streams.schema import Attempt, DeadLetter, Reward

FAST = ConsumerSettings(
    batch_size=10, block_ms=50, claim_idle_ms=150, claim_every_ms=0, retry_delay_ms=100, max_deliveries=3
)


def attempt(i: int, proof: str = "ok") -> Attempt:
    return Attempt(attempt_id=f"a{i}", work_id="w", theorem_id=f"t{i}", policy_version=0, sample_index=i, proof=proof)


def reward_for(d: Delivery[Attempt]) -> list[Reward]:
    a = d.message
    return [Reward(attempt_id=a.attempt_id, theorem_id=a.theorem_id, policy_version=0, verdict="proved", reward=1.0)]


class Recorder:
    """A handler that records each call and can be told to fail for chosen attempt ids."""

    def __init__(self, *, poison=(), transient=(), crash=(), fail_times: int = 10**9):
        self.calls: list[tuple[str, int]] = []
        self.poison, self.transient, self.crash = set(poison), set(transient), set(crash)
        self.fail_times = fail_times

    async def __call__(self, d: Delivery[Attempt]) -> list[Reward]:
        aid = d.message.attempt_id
        self.calls.append((aid, d.deliveries))
        failures = sum(1 for a, _ in self.calls if a == aid) - 1
        if aid in self.crash:
            raise KeyboardInterrupt  # stands for the process dying: not an Exception, so nothing catches it
        if aid in self.poison:
            raise Poison("statement missing")
        if aid in self.transient and failures < self.fail_times:
            raise ConnectionResetError("sandbox went away")
        return reward_for(d)


def consumer(redis, keys, handler, name="c1", settings=FAST) -> Consumer:
    return Consumer(
        redis, keys, message_type=Attempt, group=VERIFIERS, name=name, handler=handler, output=Reward, settings=settings
    )


async def rewards(redis, keys) -> Counter:
    return Counter(decode(Reward, f).attempt_id for _, f in await redis.xrange(keys.rewards))


async def dead_letters(redis, keys) -> list[DeadLetter]:
    return [decode(DeadLetter, f) for _, f in await redis.xrange(keys.dlq)]


async def drain(c: Consumer, until, timeout_s: float = 10.0) -> None:
    """Run iterations until the observable condition `until()` holds (bounded)."""
    deadline = time.monotonic() + timeout_s
    while not await until():
        assert time.monotonic() < deadline, "condition not reached in time"
        await c.run_once()


async def pending(redis, keys) -> int:
    return (await redis.xpending(keys.attempts, VERIFIERS))["pending"]


def all_settled(redis, keys):
    """Condition: the group has nothing pending and nothing undelivered."""

    async def check() -> bool:
        [g] = [g for g in await group_states(redis, keys.attempts) if g.name == VERIFIERS]
        return g.outstanding == 0

    return check


def length_is(redis, key: str, n: int):
    async def check() -> bool:
        return await redis.xlen(key) == n

    return check


async def test_every_entry_gets_one_result_and_is_acked(redis, keys):
    await Publisher(redis, keys).publish([attempt(i) for i in range(25)])
    c = consumer(redis, keys, Recorder())
    await c.ensure_group()
    while await c.run_once():
        pass
    assert await rewards(redis, keys) == Counter({f"a{i}": 1 for i in range(25)})
    assert await pending(redis, keys) == 0


async def test_same_input_published_twice_gives_one_result(redis, keys):
    pub = Publisher(redis, keys)
    await pub.publish([attempt(1), attempt(2)])
    await pub.publish([attempt(1)])  # a retried producer batch: same attempt id, new entry id
    c = consumer(redis, keys, Recorder())
    await c.ensure_group()
    await drain(c, all_settled(redis, keys))
    assert await rewards(redis, keys) == Counter({"a1": 1, "a2": 1})
    assert c.stats.duplicates == 1


async def test_entry_reclaimed_while_first_consumer_still_holds_it_gives_one_result(redis, keys):
    """A slow consumer and the one that reclaimed its entry both finish it: one result, both ack."""
    await Publisher(redis, keys).publish([attempt(1)])
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow(d):
        started.set()
        await release.wait()
        return reward_for(d)

    slow_c = consumer(redis, keys, slow, name="slow")
    await slow_c.ensure_group()
    first = asyncio.create_task(slow_c.run_once())
    await started.wait()
    fast_c = consumer(redis, keys, Recorder(), name="fast")
    await drain(fast_c, length_is(redis, keys.rewards, 1))
    release.set()
    await first
    assert await rewards(redis, keys) == Counter({"a1": 1})
    assert slow_c.stats.duplicates == 1 and fast_c.stats.reclaimed == 1
    assert await pending(redis, keys) == 0


async def test_dead_consumer_entries_are_reclaimed_with_their_delivery_count(redis, keys):
    await Publisher(redis, keys).publish([attempt(i) for i in range(5)])
    dead = consumer(redis, keys, Recorder(), name="dead")
    await dead.ensure_group()
    await redis.xreadgroup(VERIFIERS, "dead", {keys.attempts: ">"}, count=5)  # read, then "die"
    handler = Recorder()
    live = consumer(redis, keys, handler, name="live")
    await drain(live, all_settled(redis, keys))
    assert await rewards(redis, keys) == Counter({f"a{i}": 1 for i in range(5)})
    assert sorted(handler.calls) == [(f"a{i}", 2) for i in range(5)]
    assert live.stats.reclaimed == 5


async def test_poison_and_undecodable_entries_go_to_dead_letters_at_once_neighbours_unaffected(redis, keys):
    pub = Publisher(redis, keys)
    await pub.publish([attempt(0), attempt(1, proof="POISON")])
    bad = encode(attempt(2))
    await redis.xadd(keys.attempts, {**bad, b"v": b"99"})  # unknown schema version
    await redis.xadd(keys.attempts, {b"v": b"1", b"attempt_id": b"a9"})  # missing fields
    await redis.xadd(keys.attempts, {**encode(attempt(5)), b"proof": b"\xff\xfe"})  # not UTF-8
    await redis.xadd(keys.attempts, {**encode(attempt(3)), b"sample_index": b"\x00\x81"})
    await pub.publish([attempt(4)])
    handler = Recorder(poison={"a1"})
    c = consumer(redis, keys, handler)
    await c.ensure_group()
    assert await c.run_once() == 7
    assert await rewards(redis, keys) == Counter({"a0": 1, "a4": 1})
    letters = await dead_letters(redis, keys)
    reasons = [dl.reason for dl in letters]
    assert reasons[0] == "poison: statement missing"
    assert "unknown schema version" in reasons[1]
    assert "missing field" in reasons[2]
    assert "Attempt.proof: cannot decode" in reasons[3]
    assert "sample_index" in reasons[4]
    assert all(dl.deliveries == 1 for dl in letters)
    assert letters[1].original == {**bad, b"v": b"99"}  # byte for byte, so it can be requeued as it was
    assert await pending(redis, keys) == 0


async def test_transient_failure_stays_pending_then_succeeds(redis, keys):
    await Publisher(redis, keys).publish([attempt(0), attempt(1)])
    handler = Recorder(transient={"a0"}, fail_times=1)
    c = consumer(redis, keys, handler)
    await c.ensure_group()
    await c.run_once()
    assert await rewards(redis, keys) == Counter({"a1": 1})
    assert await pending(redis, keys) == 1
    await drain(c, all_settled(redis, keys))
    assert await rewards(redis, keys) == Counter({"a0": 1, "a1": 1})
    assert [d for a, d in handler.calls if a == "a0"] == [1, 2]
    assert await dead_letters(redis, keys) == []


async def test_crashing_entry_is_dead_lettered_after_max_deliveries_and_neighbours_get_one_result(redis, keys):
    """An entry that kills its consumer on every delivery. Its batch neighbours are reclaimed with it;
    processed one at a time, they each get exactly one result and never reach the dead letters."""
    await Publisher(redis, keys).publish([attempt(i) for i in range(6)])
    handler = Recorder(crash={"a2"})
    generation = crashes = 0
    await consumer(redis, keys, handler).ensure_group()

    async def done() -> bool:
        return await pending(redis, keys) == 0 and await redis.xlen(keys.dlq) == 1

    deadline = time.monotonic() + 15
    while not await done():
        assert time.monotonic() < deadline
        generation += 1  # each crash is a new consumer process in real life
        c = consumer(redis, keys, handler, name=f"c{generation}")
        await c.ensure_group()
        try:
            await drain(c, done, timeout_s=5)
        except KeyboardInterrupt:
            crashes += 1
    assert await rewards(redis, keys) == Counter({f"a{i}": 1 for i in range(6) if i != 2})
    [letter] = await dead_letters(redis, keys)
    assert decode(Attempt, letter.original).attempt_id == "a2"
    assert letter.reason == f"delivered {FAST.max_deliveries + 1} times (max {FAST.max_deliveries})"
    assert [d for a, d in handler.calls if a == "a2"] == [1, 2, 3]
    assert crashes == FAST.max_deliveries


async def test_transient_failures_end_in_dead_letters_after_max_deliveries(redis, keys):
    await Publisher(redis, keys).publish([attempt(0), attempt(1)])
    handler = Recorder(transient={"a0"})
    c = consumer(redis, keys, handler)
    await c.ensure_group()
    await drain(c, length_is(redis, keys.dlq, 1))
    [letter] = await dead_letters(redis, keys)
    assert letter.deliveries == FAST.max_deliveries + 1
    assert await rewards(redis, keys) == Counter({"a1": 1})
    assert await pending(redis, keys) == 0


async def test_stop_mid_batch_settles_what_is_done_and_releases_the_rest(redis, keys):
    await Publisher(redis, keys).publish([attempt(i) for i in range(10)])
    stop = asyncio.Event()
    calls = 0

    async def stop_after_three(d):
        nonlocal calls
        calls += 1
        if calls == 3:
            stop.set()
        return reward_for(d)

    settings = ConsumerSettings(batch_size=10, block_ms=50, claim_idle_ms=60_000, claim_every_ms=0)
    c = consumer(redis, keys, stop_after_three, settings=settings)
    await c.ensure_group()
    await c.run_once(stop)
    assert await rewards(redis, keys) == Counter({f"a{i}": 1 for i in range(3)})
    # The other seven are claimable at once, although the deadline is a minute, and cost no delivery.
    handler = Recorder()
    other = consumer(redis, keys, handler, name="other", settings=settings)
    await drain(other, all_settled(redis, keys))
    assert sorted(handler.calls) == sorted((f"a{i}", 1) for i in range(3, 10))


async def test_run_survives_a_consumer_without_results(redis, keys):
    """A consumer with no output (the trainer's shape) acks what it handled and publishes nothing."""
    await Publisher(redis, keys).publish([attempt(0)])
    seen = []

    async def record(d):
        seen.append(d.message.attempt_id)
        return []

    c = Consumer(redis, keys, message_type=Attempt, group="audit", name="a", handler=record, settings=FAST)
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    deadline = time.monotonic() + 5
    while not seen or (await redis.xpending(keys.attempts, "audit"))["pending"]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)  # polls an observable condition; the consumer runs concurrently
    stop.set()
    await task
    assert seen == ["a0"] and await redis.xlen(keys.rewards) == 0


async def test_overdue_entry_behind_a_long_pending_list_is_reclaimed_in_one_pass(redis, keys):
    """XAUTOCLAIM COUNT 1 looks at 10 pending entries per call; one pass must still reach entry 300."""
    await Publisher(redis, keys).publish([attempt(i) for i in range(301)])
    await consumer(redis, keys, Recorder()).ensure_group()
    await redis.xreadgroup(VERIFIERS, "dead", {keys.attempts: ">"}, count=301)
    ids = [eid for eid, _ in await redis.xrange(keys.attempts)]
    await wait_idle_at_least(redis, keys, ids[300], FAST.claim_idle_ms)
    await redis.xclaim(keys.attempts, VERIFIERS, "busy", 0, ids[:300])  # just delivered again: not overdue
    handler = Recorder()
    c = consumer(redis, keys, handler, name="live")
    assert await c.run_once() == 1
    assert handler.calls == [("a300", 2)]


async def wait_idle_at_least(redis, keys, entry_id: bytes, ms: int) -> None:
    deadline = time.monotonic() + 5
    while True:  # Redis's own idle counter is the condition under test
        [row] = await redis.xpending_range(keys.attempts, VERIFIERS, min=entry_id, max=entry_id, count=1)
        if row["time_since_delivered"] >= ms:
            return
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def test_a_handler_returning_the_wrong_message_type_escapes_and_acks_nothing(redis, keys):
    """A handler bug is not the input's fault: it escapes `run_once` (and `run`), nothing is published or
    acked, and the entry stays pending for a fixed handler."""
    await Publisher(redis, keys).publish([attempt(i) for i in range(3)])

    async def wrong(d: Delivery[Attempt]) -> list:
        return [d.message]  # an Attempt where a Reward is due

    c = consumer(redis, keys, wrong)
    await c.ensure_group()
    with pytest.raises(TypeError, match="handler returned Attempt; this consumer writes"):
        await c.run_once()
    assert await redis.xlen(keys.rewards) == 0 and await pending(redis, keys) == 3


async def _oom_errors(redis) -> int:
    stat = (await redis.info("errorstats")).get("errorstat_OOM", {})
    return int(stat.get("count", 0)) if isinstance(stat, dict) else 0


async def test_a_full_redis_refusing_writes_pauses_the_loop_until_memory_is_freed(redis, keys):
    """maxmemory with noeviction makes every write answer OOM. The loop backs off and retries as for an
    unreachable Redis: the task must not end, and once memory is there again every entry gets its result."""
    await Publisher(redis, keys).publish([attempt(i) for i in range(3)])
    c = consumer(redis, keys, Recorder())
    await c.ensure_group()
    before = await _oom_errors(redis)
    saved = await redis.config_get("maxmemory*")
    stop = asyncio.Event()
    task = None
    try:
        await redis.config_set("maxmemory-policy", "noeviction")
        await redis.config_set("maxmemory", 1)  # below what the server already uses: every write is refused
        task = asyncio.create_task(c.run(stop))
        deadline = time.monotonic() + 10
        while await _oom_errors(redis) < before + 2:  # refused at least twice: the loop came back after one
            assert time.monotonic() < deadline and not task.done(), task.done() and task.exception()
            await asyncio.sleep(0.01)  # polls an observable condition; the consumer runs concurrently
        assert await redis.xlen(keys.rewards) == 0
    finally:
        await redis.config_set("maxmemory", saved["maxmemory"])
        await redis.config_set("maxmemory-policy", saved["maxmemory-policy"])
    deadline = time.monotonic() + 10
    while (await rewards(redis, keys)) != Counter({f"a{i}": 1 for i in range(3)}):
        assert time.monotonic() < deadline and not task.done(), task.done() and task.exception()
        await asyncio.sleep(0.01)
    stop.set()
    await task
    assert await pending(redis, keys) == 0


async def test_what_a_consumer_held_when_redis_died_is_taken_again_at_once_and_costs_no_delivery(tmp_path):
    """Redis dies while an entry is in hand, so its settle fails; when Redis is back (its AOF kept the entry
    pending under this consumer), the consumer hands its pending entries back and takes them again at once,
    not after claim_idle_ms (a minute here), and the outage costs the entry no delivery."""
    from streams.connect import connect
    from streams.embedded import EmbeddedRedis
    from streams.keys import Keys

    server = EmbeddedRedis(data_dir=tmp_path / "redis", appendfsync="always").start()
    redis, keys = connect(server.url), Keys("blip")
    await Publisher(redis, keys).publish([attempt(0)])
    calls: list[int] = []

    async def handler(d: Delivery[Attempt]) -> list[Reward]:
        calls.append(d.deliveries)
        if len(calls) == 1:
            server.kill()  # the result cannot be settled: Redis is gone
        return reward_for(d)

    slow_reclaim = ConsumerSettings(batch_size=10, block_ms=50, claim_idle_ms=60_000, claim_every_ms=0)
    c = consumer(redis, keys, handler, settings=slow_reclaim)
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    try:
        deadline = time.monotonic() + 20
        while c.stats.outages == 0:  # the settle failed and the loop is waiting for Redis
            assert time.monotonic() < deadline and not task.done(), task.done() and task.exception()
            await asyncio.sleep(0.01)  # polls an observable condition; the consumer runs concurrently
        server.start()  # the same port and data: the entry is pending under c1, idle for less than a minute
        started = time.monotonic()
        while (await rewards(redis, keys)) != Counter({"a0": 1}):
            assert time.monotonic() - started < 15 and not task.done(), task.done() and task.exception()
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await redis.aclose()
        server.close()
    assert calls == [1, 1]  # handled again, and the outage cost it no delivery
    assert c.stats.handed_back == 1
