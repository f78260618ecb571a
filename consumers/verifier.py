"""The verifier consumer's handler: one proof attempt in, one verdict out (attempts -> rewards).

Per attempt: look up the canonical problem in `{ps:R}:theorems` (an attempt naming an unknown theorem is
poison: dead-lettered with the reason), consult the verdict cache, else run the task's checker in this
consumer's sandbox (when its turn comes: consumers.service). Verdicts `proved` / `rejected` / `timeout`
become rewards; `error` (the infrastructure failed: a sandbox that cannot start, a header that does not
elaborate) raises VerifierFault, so the attempt stays pending and is redelivered, and on its last allowed
delivery VerifierGaveUp dead-letters it as `infrastructure: <the checker's reason>`: a verifier failure is
never a reward of 0, never cached, and never blamed on the attempt.

The cache key holds the checker's environment (verifier_pool.checkers: its version, its judging code, its
sandbox's identity), read when the cache is consulted and again when the verdict is stored: a verdict is
stored under the environment that judged it, and a checker whose sandbox has not answered a handshake
(environment None) is never served from the cache nor stored into it.
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
from streams.runtime import Delivery, Infrastructure, Poison
from streams.schema import Attempt, Reward
from streams.theorems import Theorem, fetch
from tasks import countdown
from tasks.countdown_check import scored
from verifier_pool.judgement import Judgement

log = structlog.get_logger("consumers.verifier")

REWARDS = {"proved": 1.0, "rejected": 0.0, "timeout": 0.0}
CACHEABLE = {"proved", "rejected"}  # deterministic outcomes; a timeout may pass on a less loaded machine


def reward_of(judgement: Judgement) -> float:
    """The verdict's reward; a rejected answer's partial credit where its checker gives one (Countdown)."""
    if judgement.verdict not in REWARDS:
        raise ValueError(f"verdict {judgement.verdict!r} has no reward: {judgement.detail[:200]}")
    if judgement.verdict == "rejected" and judgement.score is not None:
        return judgement.score
    return REWARDS[judgement.verdict]


def credit(theorem: Theorem, proof: str, judgement: Judgement) -> tuple[float, dict[str, float]]:
    """The reward of `judgement` under the theorem's reward scheme, and the answer's credit by part. Lean: the
    verdict's reward, no parts. Countdown: the parts (tasks.countdown.verdict_parts), and the reward the
    checker gave (`shaped`, its partial credit) or the paper's (`paper`: the format's 0.1 or 1.0 solved, from
    the same parts: tasks.countdown_check.scored)."""
    reward = reward_of(judgement)
    if theorem.task != "countdown":
        return reward, {}
    parts = countdown.verdict_parts(proof, judgement.verdict, judgement.detail, judgement.score)
    return (scored(parts, "paper") if theorem.reward == "paper" else reward), parts


class VerifierFault(Exception):
    """The checker could not judge the attempt (sandbox down, REPL protocol broken): retry later."""


class VerifierGaveUp(Infrastructure):
    """The checker could not judge the attempt on its last allowed delivery: dead-lettered now, with the
    infrastructure's reason (the runtime's own dead letter, one delivery later, would only count them)."""


class Checker(Protocol):
    # What the verdict depends on besides the text (checker version, toolchain, sandbox identity); None
    # while unknown (its sandbox has not answered a handshake): then the cache is not used.
    environment: str | None

    async def check(self, theorem: Theorem, proof: str) -> Judgement: ...


def verdict_digest(theorem: Theorem, proof: str, environment: str) -> str:
    """Cache key: the same statement, proof and environment always get the same verdict. The SHA-256 of each
    part followed by a NUL byte (one buffer, hashed at once). A Countdown problem's reward scheme joins its
    numbers and target where it is not the default (a verdict is never served to a run that scores
    otherwise); inside their JSON, so no proof can write its way across the NUL between two parts."""
    problem = [theorem.numbers, theorem.target, theorem.reward] if theorem.reward else [theorem.numbers, theorem.target]
    parts = (environment, theorem.task, theorem.header, theorem.statement, orjson.dumps(problem).decode(), proof, "")
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


class VerifyHandler:
    """The handler a verifier consumer runs. Its checkers (one sandbox each) may be shared with the other
    consumers of the same `turn`: a lock that lets one of them check at a time, while the others settle
    their last attempt, read the next and look it up in the cache (consumers.service)."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        checkers: Mapping[str, Checker],
        sandbox_id: str,
        turn: asyncio.Lock | None = None,
        max_deliveries: int | None = None,
    ) -> None:
        """`max_deliveries`: the consumer's; a fault on that delivery dead-letters the attempt with its reason
        (None: left to the runtime, which dead-letters on the next delivery, saying only how many)."""
        self.redis = redis
        self.keys = keys
        self.checkers = checkers
        self.sandbox_id = sandbox_id
        self.turn = turn or asyncio.Lock()
        self.max_deliveries = max_deliveries
        self._theorems: dict[str, Theorem] = {}  # canonical records never change within a run
        self._prefetched: dict[str, bytes | None] = {}  # digest -> cached verdict, for the batch in hand
        self._ahead: set[str] = set()  # attempts of the batch in hand not handled yet
        self._stores: dict[str, bytes] = {}  # digest -> verdict judged in this batch, to be cached (`store`)
        # Attempts of the batch in hand that missed the cache and whose checker judges several at once
        # (`check_many`): checked together at the first one's turn (`_check`), their verdicts kept until theirs.
        self._unjudged: dict[str, tuple[Attempt, Theorem]] = {}
        self._judged: dict[str, tuple[Judgement, str | None, float]] = {}  # attempt id -> (verdict, env, check s)
        self.busy_s = 0.0  # time its sandboxes spent checking for it, for the pool's utilization figure

    async def __call__(self, d: Delivery[Attempt]) -> list[Reward]:
        """Judge one attempt. The verdicts checked in a batch are cached together once its last attempt is
        handled (one HSET a batch: a round trip between two checks left the sandbox idle)."""
        self._ahead.discard(d.message.attempt_id)
        try:
            return await self._judge(d)
        finally:
            if self._stores and not self._ahead:
                await self.store()

    async def store(self) -> None:
        """Cache the verdicts judged since the last store (VerifierService.stop calls it for a drained batch)."""
        stores, self._stores = self._stores, {}
        if stores:
            await self.redis.hset(self.keys.verdicts, mapping=stores)

    async def _judge(self, d: Delivery[Attempt]) -> list[Reward]:
        a = d.message
        theorem = await self._theorem(a.theorem_id)
        checker = self.checkers.get(theorem.task)
        if checker is None:
            raise Poison(f"no checker for task {theorem.task!r} in this pool (has: {', '.join(self.checkers)})")
        start = time.perf_counter()
        environment = checker.environment
        digest = None if environment is None else verdict_digest(theorem, a.proof, environment)
        judgement = None if digest is None else await self._cached(digest)
        cached = judgement is not None
        verify_ms = (time.perf_counter() - start) * 1000
        if judgement is None:
            judged = self._judged.pop(a.attempt_id, None)
            if judged is None:
                async with self.turn:  # the sandbox's check, from when it is free: the wait is not verify time
                    judged = await self._check(checker, theorem, a)
                # Let the task waiting for the turn start its check before this one goes on: nothing below waits
                # on Redis until the next attempt, so the slot would idle while this task builds its reward,
                # settles and looks up its next attempt.
                await asyncio.sleep(0)
            judgement, judged_by, check_s = judged
            verify_ms = check_s * 1000
            if judgement.verdict == "error":
                raise self._fault(d, judgement.detail)
            if judgement.verdict in CACHEABLE and judged_by is not None:
                if judged_by != environment:
                    digest = verdict_digest(theorem, a.proof, judged_by)
                encoded = self._stores[digest] = judgement.encode()
                if digest in self._prefetched:  # the same proof later in this batch: a hit, not a second check
                    self._prefetched[digest] = encoded
        reward, parts = credit(theorem, a.proof, judgement)
        log.info(
            "verified",
            attempt_id=a.attempt_id,
            theorem_id=a.theorem_id,
            verdict=judgement.verdict,
            reason=judgement.reason,
            cached=cached,
            verify_ms=round(verify_ms, 1),
        )
        return [
            Reward(
                attempt_id=a.attempt_id,
                theorem_id=a.theorem_id,
                policy_version=a.policy_version,
                verdict=judgement.verdict,
                reward=reward,
                reason=judgement.reason,
                member=a.member,
                work_id=a.work_id,
                sample_index=a.sample_index,
                verify_ms=round(verify_ms, 3),
                sandbox_id=self.sandbox_id,
                cached=cached,
                detail=judgement.detail[:300],
                attempt_entry=d.entry_id.decode(),
                parts=parts,
            )
        ]

    async def _check(self, checker: Checker, theorem: Theorem, a: Attempt) -> tuple[Judgement, str | None, float]:
        """Under the turn: `a`'s verdict, the environment that judged it (read under the turn, so no other check
        has replaced the sandbox since: a verdict comes whole from the sandbox that ends the check) and its
        share of the sandbox's time. A checker that judges several at once (`check_many`: Countdown's
        sub-millisecond checks) also judges the batch's other attempts still ahead that missed the cache; their
        verdicts wait in `_judged`, the time split evenly among them."""
        self._unjudged.pop(a.attempt_id, None)
        check_many = getattr(checker, "check_many", None)
        others = (
            []
            if check_many is None
            else [(o, t) for o, t in self._unjudged.values() if t.task == theorem.task and o.attempt_id in self._ahead]
        )
        start = time.perf_counter()
        if others:
            judgements = await check_many([(theorem, a.proof)] + [(t, o.proof) for o, t in others])
        else:
            judgements = [await checker.check(theorem, a.proof)]
        elapsed = time.perf_counter() - start
        self.busy_s += elapsed
        judged_by, share = checker.environment, elapsed / len(judgements)
        for (o, _), judgement in zip(others, judgements[1:], strict=True):
            del self._unjudged[o.attempt_id]
            self._judged[o.attempt_id] = (judgement, judged_by, share)
        return judgements[0], judged_by, share

    async def prefetch(self, attempts: list[Attempt]) -> None:
        """Look up the verdicts of a batch's attempts in one HMGET (the consumer calls this before handing
        them over one by one): a batch of cache hits costs three round trips in all, not two per attempt.
        An attempt whose theorem is unknown or whose checker's environment is unknown is left to `__call__`."""
        await self.store()  # left from a batch whose end was not handled (a stop); none otherwise
        self._ahead = {a.attempt_id for a in attempts}
        self._judged = {}  # verdicts of a batch a stop cut short: their attempts were released, unsettled
        looked_up: list[tuple[Attempt, Theorem, str]] = []
        environments = {task: c.environment for task, c in self.checkers.items()}  # once a batch: stats() copies
        for a in attempts:
            theorem = self._theorems.get(a.theorem_id)
            if theorem is None:
                theorem = await fetch(self.redis, self.keys, a.theorem_id)
                if theorem is None:
                    continue  # __call__ dead-letters it
                self._theorems[a.theorem_id] = theorem
            environment = environments.get(theorem.task)
            if environment is not None:
                looked_up.append((a, theorem, verdict_digest(theorem, a.proof, environment)))
        digests = [digest for _, _, digest in looked_up]
        raws = await self.redis.hmget(self.keys.verdicts, digests) if digests else []
        self._prefetched = dict(zip(digests, raws, strict=True))
        # The misses a `check_many` may judge together; a proof seen twice once only (the second is then a hit).
        seen: set[str] = set()
        self._unjudged = {}
        for (a, theorem, digest), raw in zip(looked_up, raws, strict=True):
            if raw is None and digest not in seen and hasattr(self.checkers.get(theorem.task), "check_many"):
                seen.add(digest)
                self._unjudged[a.attempt_id] = (a, theorem)

    def _fault(self, d: Delivery[Attempt], detail: str) -> Exception:
        if self.max_deliveries is not None and d.deliveries >= self.max_deliveries:
            return VerifierGaveUp(f"verifier: no verdict on any of {d.deliveries} deliveries: {detail}")
        return VerifierFault(detail)

    async def _theorem(self, theorem_id: str) -> Theorem:
        if theorem_id not in self._theorems:
            theorem = await fetch(self.redis, self.keys, theorem_id)
            if theorem is None:
                raise Poison(f"theorem {theorem_id!r} is not registered in {self.keys.theorems}")
            self._theorems[theorem_id] = theorem
        return self._theorems[theorem_id]

    async def _cached(self, digest: str) -> Judgement | None:
        if digest in self._prefetched:  # looked up with its batch (`prefetch`)
            raw = self._prefetched[digest]
        else:
            raw = await self.redis.hget(self.keys.verdicts, digest)
        return None if raw is None else Judgement.decode(raw)
