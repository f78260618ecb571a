"""A verifier worker stalled mid-check (SIGSTOP past the proof's timeout, then SIGCONT) gives the attempt its
real verdict, never `timeout`; with a second worker that reclaims the attempt meanwhile, still exactly one
reward, with the real verdict.

Real worker processes (`verifier_worker.py`: the real VerifierService), a real Redis, the process sandbox
(bubblewrap or unshare) running the REPL test double (ops/bench/synthetic_repl.py; it says nothing about Lean)
with its `FIXTURE:slow=<s>` and `FIXTURE:hang` markers. "Mid-check" is observed, not guessed: the worker is
stopped once its sandboxed checker sleeps inside the proof's request (the kernel's wait channel of the
checker process says `nanosleep`). The durations of the stops are the scenario ("past the timeout"), not
synchronization; everything else waits on conditions with generous deadlines.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streams.codec import decode
from streams.keys import VERIFIERS
from streams.publisher import Publisher
from streams.runtime import ensure_group
from streams.schema import Attempt, Reward
from streams.theorems import Theorem, register
from tests.fixtures import FAKE_REPL
from tests.streams.consumer_process import cleanup, finish
from verifier_pool import process

pytestmark = [
    pytest.mark.skipif(process.available() is None, reason="neither bubblewrap nor unshare works here"),
    pytest.mark.timeout(180),
]

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
STATEMENT = "theorem mathd_numbertheory_188 : Nat.gcd 180 168 = 12 := by"
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n"
PROOF_TIMEOUT_S = 2.0


def spawn(redis_url: str, run: str, log: Path, **settings) -> subprocess.Popen:
    env = {
        **os.environ,
        "PROOFSTREAM_REDIS_URL": redis_url,
        "PROOFSTREAM_RUN": run,
        "PROOFSTREAM_LOG_LEVEL": "info",
        "PROOFSTREAM_SANDBOX": "process",
        "PROOFSTREAM_CONCURRENCY": "1",
        "PROOFSTREAM_TASKS": '["lean"]',
        "PROOFSTREAM_LEAN_WORKDIR": str(ROOT),
        "PROOFSTREAM_LEAN_REPL_CMD": json.dumps(["/usr/bin/python3", "-I", str(FAKE_REPL)]),
        "PROOFSTREAM_PROOF_TIMEOUT_S": str(PROOF_TIMEOUT_S),
        "PROOFSTREAM_HEADER_TIMEOUT_S": "20",
        "PROOFSTREAM_MEMORY_LIMIT_MB": "1024",
        "PROOFSTREAM_LEAN_AUDIT_CMD": json.dumps(["/usr/bin/python3", str(FIXTURES / "fake_audit.py")]),
    }
    env.update({f"PROOFSTREAM_{k.upper()}": str(v) for k, v in settings.items()})
    env.pop("PROOFSTREAM_CONFIG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.consumers.verifier_worker"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # exited meanwhile
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def checker_sleeping_in_a_request(worker: int) -> bool:
    """Is a sandboxed fake REPL under `worker` inside a FIXTURE:slow / FIXTURE:hang request right now?"""
    for pid in descendants(worker):
        try:
            if (
                FAKE_REPL.name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
                and "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
            ):
                return True
        except OSError:
            continue
    return False


async def until(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)  # polls an observable condition


async def rewards(redis, keys) -> list[Reward]:
    return [decode(Reward, f) for _, f in await redis.xrange(keys.rewards)]


async def setup(redis, keys, proof: str) -> None:
    await register(redis, keys, [Theorem("t", "lean", statement=STATEMENT, header=HEADER)])
    await ensure_group(redis, keys.attempts, VERIFIERS)
    await Publisher(redis, keys).publish(
        [
            Attempt(
                attempt_id="a0", work_id="w", theorem_id="t", policy_version=0, sample_index=0, proof=proof, task="lean"
            )
        ]
    )


async def stop_mid_check(worker: subprocess.Popen) -> float:
    """SIGSTOP `worker` once its checker is inside the proof's request; return when (monotonic) it stopped."""

    async def mid_check() -> bool:
        assert worker.poll() is None, "the worker died"
        return checker_sleeping_in_a_request(worker.pid)

    await until(mid_check, "the worker's checker to be inside the proof's request")
    worker.send_signal(signal.SIGSTOP)
    return time.monotonic()


def verified_events(log: Path) -> list[dict]:
    events = []
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "verified":
            events.append(event)
    return events


@pytest.mark.parametrize(
    "marker, verdict",
    [
        ("FIXTURE:slow=1", "proved"),  # answered 1 s in, while the worker was stopped: the answer wins
        ("FIXTURE:hang", "timeout"),
    ],  # never answers: still a timeout, after the worker's awake budget
)
async def test_a_worker_stopped_mid_check_past_the_timeout_gives_the_real_verdict(
    one_redis, one_redis_url, keys, tmp_path, marker, verdict
):
    await setup(one_redis, keys, f"{STATEMENT}\n  norm_num -- {marker}")
    worker = spawn(one_redis_url, keys.run, tmp_path / "worker.log")
    try:
        stopped = await stop_mid_check(worker)
        await asyncio.sleep(PROOF_TIMEOUT_S + 2)  # the stall itself: past the proof's timeout
        worker.send_signal(signal.SIGCONT)
        stalled_s = time.monotonic() - stopped

        async def rewarded() -> bool:
            return await one_redis.xlen(keys.rewards) > 0

        await until(rewarded, "the reward")
        figures, _ = finish(worker)
    finally:
        cleanup(worker)
    [r] = await rewards(one_redis, keys)
    assert (r.attempt_id, r.verdict) == ("a0", verdict), r.detail
    assert r.reward == (1.0 if verdict == "proved" else 0.0)
    assert stalled_s > PROOF_TIMEOUT_S
    assert figures["sandbox_timeouts"] == int(verdict == "timeout"), figures
    assert (await one_redis.xpending(keys.attempts, VERIFIERS))["pending"] == 0


async def test_a_stopped_worker_whose_attempt_is_reclaimed_wakes_to_one_reward_with_the_real_verdict(
    one_redis, one_redis_url, keys, tmp_path
):
    """Two workers; the one checking is stopped past both the proof's timeout and the reclaim deadline. The
    other reclaims the attempt, checks it and publishes. The stopped one wakes, gets its own real verdict
    (its log says `proved`, not `timeout`) and publishes nothing: one reward."""
    await setup(one_redis, keys, f"{STATEMENT}\n  norm_num -- FIXTURE:slow=1")
    logs = [tmp_path / "w0.log", tmp_path / "w1.log"]
    workers = [spawn(one_redis_url, keys.run, log, claim_idle_ms=2000) for log in logs]
    try:

        async def taken() -> bool:
            rows = await one_redis.xpending_range(keys.attempts, VERIFIERS, min="-", max="+", count=1)
            return bool(rows)

        await until(taken, "a worker to take the attempt")
        [row] = await one_redis.xpending_range(keys.attempts, VERIFIERS, min="-", max="+", count=1)
        consumer = row["consumer"].decode() if isinstance(row["consumer"], bytes) else row["consumer"]
        pid = int(consumer.split("-")[-3])  # consumers are named <host>-<pid>-<hex>-<slot>.<task>
        [held] = [i for i, w in enumerate(workers) if w.pid == pid]
        stalled, other = workers[held], workers[1 - held]
        stopped = await stop_mid_check(stalled)

        async def rewarded() -> bool:
            return await one_redis.xlen(keys.rewards) > 0

        await until(rewarded, "the other worker to reclaim and publish")
        while time.monotonic() - stopped < PROOF_TIMEOUT_S + 1:  # the stall lasts past the timeout, too
            await asyncio.sleep(0.1)
        stalled.send_signal(signal.SIGCONT)

        async def stalled_check_ended() -> bool:
            return bool(verified_events(logs[held]))

        await until(stalled_check_ended, "the woken worker to end its check")
        figures, _ = finish(stalled)
        finish(other)
    finally:
        cleanup(*workers)
    [r] = await rewards(one_redis, keys)
    assert (r.attempt_id, r.verdict, r.reward) == ("a0", "proved", 1.0)
    assert str(other.pid) in r.sandbox_id  # published by the worker that reclaimed it
    assert [e["verdict"] for e in verified_events(logs[held])] == ["proved"]  # the woken one's own verdict
    assert figures["duplicates"] == 1 and figures["sandbox_timeouts"] == 0, figures
    assert (await one_redis.xpending(keys.attempts, VERIFIERS))["pending"] == 0
