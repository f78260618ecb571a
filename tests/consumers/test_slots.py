"""A verifier slot's two consumer tasks take turns at its sandbox (consumers.service): while one checks, the
other has already read the next attempt; the sandbox never checks two at once; a stop finishes both.

Real Redis and the real VerifierService; the checker is a stand-in whose checks wait for the test to open a
gate, so "while the first check runs" is a state the test holds, not a timing it hopes for."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from consumers.service import VerifierService
from streams.codec import decode
from streams.groups import group_states
from streams.keys import VERIFIERS
from streams.publisher import Publisher
from streams.schema import Attempt, Reward
from streams.theorems import Theorem, register
from verifier_pool import pool
from verifier_pool.checkers import CountdownChecker
from verifier_pool.config import TASKS_PER_SLOT, VerifierSettings
from verifier_pool.judgement import Judgement
from verifier_pool.sandbox import SandboxStats


class GatedSandbox:
    backend = "gated"
    sandbox_id = "gated-0"

    async def start(self) -> None:
        pass

    async def kill(self) -> None:
        pass

    def stats(self) -> SandboxStats:
        return SandboxStats(self.sandbox_id, self.backend, starts=1)


class GatedChecker:
    """Each check waits until `gate` is open; counts the checks running at once."""

    environment = "gated-checker-1"

    def __init__(self) -> None:
        self.sandbox = GatedSandbox()
        self.gate = asyncio.Event()
        self.entered = 0
        self.running = 0
        self.most_at_once = 0

    async def check(self, theorem: Theorem, proof: str) -> Judgement:
        self.entered += 1
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await self.gate.wait()
        finally:
            self.running -= 1
        return Judgement("rejected", "wrong_answer", "gated", score=0.5)


async def verifiers_group(redis, keys):
    [g] = [g for g in await group_states(redis, keys.attempts) if g.name == VERIFIERS]
    return g


async def until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_a_slot_reads_the_next_attempt_while_its_sandbox_checks_and_stop_finishes_both(redis, redis_url, keys):
    await register(redis, keys, [Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)])
    attempts = [
        Attempt(
            attempt_id=f"a{i}",
            work_id="w",
            theorem_id="cd1",
            policy_version=0,
            sample_index=i,
            proof=f"<answer>{i}</answer>",
            task="countdown",
        )
        for i in range(3)
    ]
    await Publisher(redis, keys).publish(attempts)
    checker = GatedChecker()
    # One attempt a read, as in a Lean pool (VerifierSettings.batch_size): the other task must read the next.
    settings = VerifierSettings(run=keys.run, redis_url=redis_url, concurrency=1, tasks=["countdown"], read_batch=1)
    service = VerifierService(settings, redis_url, checkers_for=lambda s, i: {"countdown": checker})
    await service.start()
    try:
        assert len(service.consumers) == TASKS_PER_SLOT == 2

        async def first_check_running_and_next_read() -> bool:
            return checker.entered == 1 and (await verifiers_group(redis, keys)).pending == 2

        # The first check holds the sandbox; the slot's other task has read the second attempt meanwhile
        # (it waits for its turn with the attempt in hand), and nobody has read the third.
        await until(first_check_running_and_next_read, "the second attempt to be read during the first check")
        assert checker.running == 1
        # Stopping now (what `stop` does first): both tasks finish the attempt in hand, one after the
        # other, and read nothing more.
        service.stop_event.set()
        checker.gate.set()
    finally:
        checker.gate.set()
        await service.stop()
    rewards = [decode(Reward, f) for _, f in await redis.xrange(keys.rewards)]
    assert sorted(r.attempt_id for r in rewards) == ["a0", "a1"]
    assert checker.most_at_once == 1  # one check at a time in the slot's sandbox
    g = await verifiers_group(redis, keys)
    assert (g.pending, g.lag) == (0, 1)  # both settled; a2 never taken


def test_the_reclaim_deadline_does_not_wait_on_the_longest_check():
    """A slot's task that waits for the check ahead keeps its attempt claimed like the one checking
    (streams.runtime refreshes both), so the deadline is a few refresh periods whatever the Lean timeouts:
    a dead worker's attempts move on within 30 s (tests/streams/test_claim_refresh.py shows the mechanism)."""
    settings = VerifierSettings(proof_timeout_s=60, header_timeout_s=600)
    consumer_settings = VerifierService(settings, "redis://127.0.0.1:1").consumer_settings
    assert consumer_settings.claim_idle_ms == settings.claim_idle_ms <= 30_000
    assert consumer_settings.claim_refresh_ms * 3 <= consumer_settings.claim_idle_ms


def test_a_lean_pool_reads_one_attempt_at_a_time_and_countdown_batches():
    """A batch is checked in order by one slot: free for Countdown's millisecond checks, minutes of Lean checks
    queued behind one slot while the others idle (VerifierSettings.batch_size)."""
    lean = VerifierSettings(tasks=["lean", "countdown"], sandbox="kimina", kimina_url="http://k:8000")
    assert (lean.batch_size, VerifierSettings(tasks=["countdown"]).batch_size) == (1, 16)
    assert VerifierSettings(tasks=["countdown"], read_batch=3).batch_size == 3


class _BrokenSandbox(GatedSandbox):
    """A sandbox whose start raises what no backend should (a bug, a daemon's unexpected answer): not the
    SandboxUnavailable the service turns into a red health check."""

    sandbox_id = "broken"

    def __init__(self, after) -> None:
        self.after = after

    async def start(self) -> None:
        while self.after.pid is None:  # the slot's other sandbox is up first
            await asyncio.sleep(0.01)  # polls its state
        raise RuntimeError("boom")


async def test_a_start_that_fails_part_way_leaves_no_sandbox_behind_the_stop(redis_url, keys):
    """Starting a slot's sandboxes together, one failing, must not leave the others out of what `stop` kills."""
    settings = VerifierSettings(
        run=keys.run, redis_url=redis_url, concurrency=1, tasks=["countdown"], sandbox="process"
    )
    real = pool.make_sandbox(settings, "countdown", 0, "process")
    checkers = {"countdown": CountdownChecker(real), "broken": SimpleNamespace(sandbox=_BrokenSandbox(real))}
    service = VerifierService(settings, redis_url, checkers_for=lambda s, i: checkers)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            await service.start()
        assert real.pid is not None  # it started
    finally:
        await service.stop()
    assert real.pid is None  # and the stop killed it
