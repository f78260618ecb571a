"""The verifier consumer end to end: real Redis, real process sandboxes (bubblewrap or unshare), the real
Countdown checker, and the REPL test double standing in for Lean (it drives our plumbing; it says
nothing about Lean)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from consumers.service import VerifierService
from consumers.verifier import VerifyHandler
from streams.groups import group_states
from streams.keys import VERIFIERS
from streams.publisher import Publisher
from streams.runtime import Consumer, ConsumerSettings, ensure_group
from streams.schema import Attempt, DeadLetter, Reward, decode
from streams.theorems import Theorem, register
from verifier_pool import docker_backend, process
from verifier_pool.checkers import LeanChecker
from verifier_pool.config import VerifierSettings
from verifier_pool.pool import PROJECT_ROOT, _python_paths

pytestmark = pytest.mark.skipif(process.available() is None, reason="neither bubblewrap nor unshare works here")

FAKE_REPL = str(Path(__file__).resolve().parent.parent / "fixtures" / "fake_repl.py")
STATEMENT = "theorem mathd_numbertheory_188 : Nat.gcd 180 168 = 12 := by"
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n"


def attempt(i: int, theorem_id: str, proof: str) -> Attempt:
    return Attempt(attempt_id=f"a{i}", work_id="w", theorem_id=theorem_id, policy_version=0, sample_index=i,
                   proof=proof, task="countdown")  # fmt: skip


async def wait_settled(redis, keys, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:  # polls the group's own figures: the condition under test
        states = [g for g in await group_states(redis, keys.attempts) if g.name == VERIFIERS]
        if states and states[0].outstanding == 0:
            return
        assert time.monotonic() < deadline, f"not settled: {states}"
        await asyncio.sleep(0.02)


async def rewards_by_attempt(redis, keys) -> dict[str, Reward]:
    out = {}
    for _, fields in await redis.xrange(keys.rewards):
        r = decode(Reward, fields)
        assert r.attempt_id not in out, "a reward was published twice"
        out[r.attempt_id] = r
    return out


@pytest.mark.parametrize("sandbox", ["process", "docker"])
async def test_countdown_pool_turns_attempts_into_rewards(redis, redis_url, keys, sandbox):
    if sandbox == "docker" and (why := docker_backend.why_unavailable(docker_backend.CHECKER_IMAGE)):
        pytest.skip(f"docker sandbox: {why}")
    await register(redis, keys, [Theorem("cd1", "countdown", numbers=[3, 4, 7], target=19)])
    proofs = ["<answer>3*4+7</answer>", "<answer>3+4+7</answer>", "<answer>3*4+7</answer>",
              "<answer>__import__('os')</answer>"]  # fmt: skip
    attempts = [attempt(i, "cd1", p) for i, p in enumerate(proofs)] + [attempt(9, "no-such-theorem", "1")]
    pub = Publisher(redis, keys)
    await pub.publish([a for a in attempts if a.attempt_id != "a2"])
    settings = VerifierSettings.load(
        env={}, flags={"run": keys.run, "concurrency": 2, "tasks": ["countdown"], "sandbox": sandbox}
    )
    service = VerifierService(settings, redis_url)
    await service.start()
    try:
        await wait_settled(redis, keys)
        await pub.publish([attempts[2]])  # the same proof again, once the first verdict is cached
        await wait_settled(redis, keys)
    finally:
        await service.stop()
    got = await rewards_by_attempt(redis, keys)
    assert {k: (r.verdict, r.reward, r.reason) for k, r in got.items()} == {
        "a0": ("proved", 1.0, ""),
        # partial credit: format, parses, right numbers, 14 is 5 from 19 (verifier_pool/countdown.py)
        "a1": ("rejected", round(0.1 + 0.1 + 0.3 + 0.3 * (1 - 5 / 19), 6), "wrong_answer"),
        "a2": ("proved", 1.0, ""),
        "a3": ("rejected", 0.1, "wrong_answer"),  # the format alone
    }
    assert (got["a0"].cached, got["a2"].cached) == (False, True)  # the repeated proof cost no sandbox time
    [(_, fields)] = await redis.xrange(keys.dlq)
    assert "not registered" in decode(DeadLetter, fields).reason
    stats = service.stats()
    assert stats["processed"] == 5 and stats["sandbox_starts"] == 2


def fake_lean_checker(**kwargs) -> LeanChecker:
    config = process.ProcessSandboxConfig(argv=(sys.executable, FAKE_REPL), ro_paths=(*_python_paths(),),
                                          workdir=PROJECT_ROOT, memory_limit_bytes=1 << 30, **kwargs)  # fmt: skip
    return LeanChecker(process.ProcessSandbox(config), proof_timeout_s=2.0, header_timeout_s=5.0)


@pytest.mark.parametrize(
    "proof, verdict, reason",
    [
        (f"{STATEMENT}\n  norm_num", "proved", ""),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:sorry", "rejected", "sorry"),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:error", "rejected", "lean_error"),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:axiom=sorryAx", "rejected", "sorry"),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:axiom=Lean.ofReduceBool", "rejected", "integrity"),
        (f"{STATEMENT}\n  native_decide", "rejected", "integrity"),
        ("theorem mathd_numbertheory_188 : Nat.gcd 180 168 = 13 := by\n  norm_num", "rejected", "integrity"),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:hang", "timeout", ""),
        (f"{STATEMENT}\n  norm_num -- FIXTURE:crash", "rejected", "lean_error"),
    ],
)
async def test_lean_checker_plumbing(proof, verdict, reason):
    checker = fake_lean_checker()
    await checker.sandbox.start()
    try:
        theorem = Theorem("t", "lean", statement=STATEMENT, header=HEADER)
        j = await checker.check(theorem, proof)
        assert (j.verdict, j.reason) == (verdict, reason), j.detail
        # Whatever happened, the sandbox answers the next proof (restarted if it had to be).
        again = await checker.check(theorem, f"{STATEMENT}\n  norm_num")
        assert again.verdict == "proved", again.detail
    finally:
        await checker.sandbox.kill()


async def test_header_is_elaborated_once_per_repl_process():
    checker = fake_lean_checker(max_requests=7)
    await checker.sandbox.start()
    try:
        theorem = Theorem("t", "lean", statement=STATEMENT, header=HEADER)
        for _ in range(3):  # header + 3 x (proof, #print axioms) = 7 requests: then the REPL is recycled
            assert (await checker.check(theorem, f"{STATEMENT}\n  norm_num")).verdict == "proved"
        assert checker.sandbox.stats().starts == 2
        assert (await checker.check(theorem, f"{STATEMENT}\n  norm_num")).verdict == "proved"  # header again
        assert checker.sandbox.stats().requests == 3
    finally:
        await checker.sandbox.kill()


async def test_infrastructure_failure_is_never_a_reward(redis, keys):
    """A checker whose sandbox cannot start: the attempt stays pending (then dead letters), no reward."""
    await register(redis, keys, [Theorem("t", "lean", statement=STATEMENT, header=HEADER)])
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish([attempt(0, "t", f"{STATEMENT}\n  norm_num")])
    config = process.ProcessSandboxConfig(argv=("/nonexistent/repl",))
    broken = LeanChecker(process.ProcessSandbox(config), proof_timeout_s=1, header_timeout_s=1)
    handler = VerifyHandler(redis, keys, {"lean": broken}, "broken")
    c = Consumer(redis, keys, message_type=Attempt, group=VERIFIERS, name="c", handler=handler, output=Reward,
                 settings=ConsumerSettings(claim_idle_ms=100, retry_delay_ms=50, claim_every_ms=0, block_ms=20,
                                           max_deliveries=2))  # fmt: skip
    deadline = time.monotonic() + 10
    while not await redis.xlen(keys.dlq):
        assert time.monotonic() < deadline
        await c.run_once()
    assert await redis.xlen(keys.rewards) == 0
    assert c.stats.transient_failures == 2
    [(_, fields)] = await redis.xrange(keys.dlq)
    assert Counter(decode(DeadLetter, fields).reason.split()[:1]) == Counter(["delivered"])
