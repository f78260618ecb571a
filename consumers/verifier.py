"""The verifier consumer's handler: one proof attempt in, one verdict out (attempts -> rewards).

Per attempt: look up the canonical problem in `{ps:R}:theorems` (an attempt naming an unknown theorem is
poison: dead-lettered with the reason), consult the verdict cache, else run the task's checker in this
consumer's sandbox (when its turn comes: consumers.service). Verdicts `proved` / `rejected` / `timeout`
become rewards; `error` (the infrastructure failed) raises, so the attempt stays pending and is redelivered:
a verifier failure is never a reward of 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping
from typing import Protocol

import orjson
import structlog
from redis.asyncio import Redis

from streams.keys import Keys
from streams.runtime import Delivery, Poison
from streams.schema import Attempt, Reward
from streams.theorems import Theorem, fetch
from verifier_pool.judgement import Judgement

log = structlog.get_logger("consumers.verifier")

REWARDS = {"proved": 1.0, "rejected": 0.0, "timeout": 0.0}
CACHEABLE = {"proved", "rejected"}  # deterministic outcomes; a timeout may pass on a less loaded machine


def reward_of(judgement: Judgement) -> float:
    """The verdict's reward; a rejected answer's partial credit where its checker gives one (Countdown)."""
    if judgement.verdict == "rejected" and judgement.score is not None:
        return judgement.score
    return REWARDS[judgement.verdict]


class VerifierFault(Exception):
    """The checker could not judge the attempt (sandbox down, REPL protocol broken): retry later."""


class Checker(Protocol):
    environment: str  # what the verdict depends on besides the text: toolchain + header, checker version

    async def check(self, theorem: Theorem, proof: str) -> Judgement: ...


def verdict_digest(theorem: Theorem, proof: str, environment: str) -> str:
    """Cache key: the same statement, proof and environment always get the same verdict."""
    h = hashlib.sha256()
    for part in (environment, theorem.task, theorem.header, theorem.statement,
                 orjson.dumps([theorem.numbers, theorem.target]).decode(), proof):  # fmt: skip
        h.update(part.encode())
        h.update(b"\x00")
    return h.hexdigest()


class VerifyHandler:
    """The handler a verifier consumer runs. Its checkers (one sandbox each) may be shared with the other
    consumers of the same `turn`: a lock that lets one of them check at a time, while the others settle
    their last attempt, read the next and look it up in the cache (consumers.service)."""

    def __init__(self, redis: Redis, keys: Keys, checkers: Mapping[str, Checker], sandbox_id: str,
                 turn: asyncio.Lock | None = None) -> None:  # fmt: skip
        self.redis = redis
        self.keys = keys
        self.checkers = checkers
        self.sandbox_id = sandbox_id
        self.turn = turn or asyncio.Lock()
        self._theorems: dict[str, Theorem] = {}  # canonical records never change within a run
        self.busy_s = 0.0  # time its sandboxes spent checking for it, for the pool's utilization figure

    async def __call__(self, d: Delivery[Attempt]) -> list[Reward]:
        a = d.message
        theorem = await self._theorem(a.theorem_id)
        checker = self.checkers.get(theorem.task)
        if checker is None:
            raise Poison(f"no checker for task {theorem.task!r} in this pool (has: {', '.join(self.checkers)})")
        start = time.perf_counter()
        digest = verdict_digest(theorem, a.proof, checker.environment)
        judgement, cached = await self._cached(digest), True
        if judgement is None:
            cached = False
            async with self.turn:  # the sandbox's check, from when it is free: the wait is not verify time
                start = time.perf_counter()
                judgement = await checker.check(theorem, a.proof)
                self.busy_s += time.perf_counter() - start
            if judgement.verdict == "error":
                raise VerifierFault(judgement.detail)
            if judgement.verdict in CACHEABLE:
                await self.redis.hset(self.keys.verdicts, digest, judgement.encode())
        verify_ms = (time.perf_counter() - start) * 1000
        log.info("verified", attempt_id=a.attempt_id, theorem_id=a.theorem_id, verdict=judgement.verdict,
                 reason=judgement.reason, cached=cached, verify_ms=round(verify_ms, 1))  # fmt: skip
        return [Reward(
            attempt_id=a.attempt_id, theorem_id=a.theorem_id, policy_version=a.policy_version,
            verdict=judgement.verdict, reward=reward_of(judgement), reason=judgement.reason,
            member=a.member, work_id=a.work_id, sample_index=a.sample_index, verify_ms=round(verify_ms, 3),
            sandbox_id=self.sandbox_id, cached=cached, detail=judgement.detail[:300],
        )]  # fmt: skip

    async def _theorem(self, theorem_id: str) -> Theorem:
        if theorem_id not in self._theorems:
            theorem = await fetch(self.redis, self.keys, theorem_id)
            if theorem is None:
                raise Poison(f"theorem {theorem_id!r} is not registered in {self.keys.theorems}")
            self._theorems[theorem_id] = theorem
        return self._theorems[theorem_id]

    async def _cached(self, digest: str) -> Judgement | None:
        raw = await self.redis.hget(self.keys.verdicts, digest)
        return None if raw is None else Judgement.decode(raw)
