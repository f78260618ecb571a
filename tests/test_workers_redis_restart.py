"""`arq workers.verifier` rides out a Redis restart, for real: a redis-server with its AOF
(fsync always, so nothing acknowledged is lost) killed with SIGKILL and restarted on the same port and data,
several worker processes with process sandboxes and the Countdown checker.

The same worker processes go on once Redis is back (a short outage, and one longer than arq's own connection
retries: 5 tries 1 s apart), reward what is published after the restart, answer `--check` again, and drain
(`verifier_pool_stopped`) and exit 0 on SIGTERM, also when Redis is still down at SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streams.codec import decode
from streams.connect import connect
from streams.embedded import EmbeddedRedis
from streams.keys import Keys
from streams.publisher import Publisher
from streams.schema import Attempt, Reward
from streams.theorems import Theorem, register
from verifier_pool import process

pytestmark = [
    pytest.mark.skipif(process.available() is None, reason="neither bubblewrap nor unshare works here"),
    pytest.mark.slow,
]

ARQ = str(Path(sys.executable).parent / "arq")
ROOT = Path(__file__).resolve().parent.parent
N_WORKERS = 3
# arq's own patience with an unreachable Redis at its start (RedisSettings: conn_retries=5, conn_retry_delay=1,
# conn_timeout=1): an outage longer than this is one that no setting of arq alone rides out.
ARQ_OWN_PATIENCE_S = 10


async def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.1)  # polls an observable condition of other processes


class Workers:
    """`arq workers.verifier` processes, each logging to its own file (a pipe nobody reads would fill up and
    block a worker that logs through a long outage)."""

    def __init__(self, redis_url: str, run: str, log_dir: Path, n: int) -> None:
        self.env = {
            **os.environ,
            "PROOFSTREAM_REDIS_URL": redis_url,
            "PROOFSTREAM_RUN": run,
            "PROOFSTREAM_CONCURRENCY": "1",
            "PROOFSTREAM_SANDBOX": "process",
            "PROOFSTREAM_TASKS": '["countdown"]',
            "PROOFSTREAM_LOG_LEVEL": "info",
        }
        self.logs = [log_dir / f"worker{i}.log" for i in range(n)]
        self.procs: list[subprocess.Popen] = []
        for path in self.logs:
            with path.open("wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        [ARQ, "workers.verifier"],
                        cwd=ROOT,
                        env=self.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def log(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def all_logged(self, event: str):
        async def condition() -> bool:
            return all(f'"{event}"' in self.log(i) for i in range(len(self.procs)))

        return condition

    def dead(self) -> dict[int, str]:
        """Worker index -> the tail of its log, for every worker that exited."""
        return {i: self.log(i)[-3000:] for i, p in enumerate(self.procs) if p.poll() is not None}

    async def health_checks_pass(self) -> bool:
        check = await asyncio.create_subprocess_exec(
            ARQ,
            "workers.verifier",
            "--check",
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return await check.wait() == 0

    def terminate_all(self, timeout_s: float) -> list[int | None]:
        """SIGTERM every worker at once; their exit statuses (None: still running after `timeout_s`)."""
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        statuses = []
        for p in self.procs:
            try:
                statuses.append(p.wait(timeout=max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                statuses.append(None)
        return statuses

    def stop_drained(self, timeout_s: float) -> None:
        """SIGTERM every worker; each must exit 0 within `timeout_s`, having drained its pool, without a
        traceback."""
        statuses = self.terminate_all(timeout_s)
        assert statuses == [0] * len(self.procs), {i: self.log(i)[-3000:] for i, s in enumerate(statuses) if s != 0}
        for i in range(len(self.procs)):
            log = self.log(i)
            assert '"verifier_pool_stopped"' in log, log[-3000:]
            assert "Traceback" not in log, log[-3000:]

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture
def server(tmp_path):
    data_dir = tmp_path / "redis"
    data_dir.mkdir()
    s = EmbeddedRedis(data_dir=data_dir, appendfsync="always").start()
    yield s
    s.close()


@pytest.fixture
def workers(server, tmp_path):
    w = Workers(server.url, "restart", tmp_path, N_WORKERS)
    yield w
    w.kill_all()
    for i in range(N_WORKERS):  # shown by pytest only when the test failed
        print(f"--- worker {i} (exit {w.procs[i].returncode}) ---\n{w.log(i)[-4000:]}")


class Batches:
    """Countdown attempts, each for its own theorem so that no verdict comes from the cache: every one is a
    check. Half are right (proved), half wrong (rejected)."""

    def __init__(self, url: str, keys: Keys) -> None:
        self.url = url
        self.keys = keys

    async def publish(self, name: str, n: int) -> list[str]:
        redis = connect(self.url)
        try:
            theorems = [Theorem(f"{name}-{i}", "countdown", numbers=[2, 3, 5], target=11) for i in range(n)]
            await register(redis, self.keys, theorems)
            attempts = [
                Attempt(
                    attempt_id=f"{name}-a{i}",
                    work_id=name,
                    theorem_id=t.theorem_id,
                    policy_version=0,
                    sample_index=i,
                    proof="<answer>2*3+5</answer>" if i % 2 else "<answer>2+3+5</answer>",
                    task="countdown",
                )
                for i, t in enumerate(theorems)
            ]
            await Publisher(redis, self.keys).publish(attempts)
            return [a.attempt_id for a in attempts]
        finally:
            await redis.aclose()

    async def verdicts(self, attempt_ids: list[str]) -> dict[str, str]:
        redis = connect(self.url)
        try:
            wanted = set(attempt_ids)
            rewards = [decode(Reward, f) for _, f in await redis.xrange(self.keys.rewards)]
            return {r.attempt_id: r.verdict for r in rewards if r.attempt_id in wanted}
        finally:
            await redis.aclose()

    def rewarded(self, attempt_ids: list[str]):
        async def condition() -> bool:
            return len(await self.verdicts(attempt_ids)) == len(attempt_ids)

        return condition


def expected_verdicts(attempt_ids: list[str]) -> dict[str, str]:
    return {a: "proved" if int(a.rsplit("a", 1)[1]) % 2 else "rejected" for a in attempt_ids}


async def ride_out_one_restart(server: EmbeddedRedis, workers: Workers, batches: Batches, down_s: float) -> None:
    await wait_for(workers.all_logged("verifier_pool_started"), 120, "every worker to start its sandboxes")
    before = await batches.publish("before", 8)
    await wait_for(batches.rewarded(before), 60, "rewards before the restart")

    # Killed while the workers poll and read: arq's loop, the consumers and the health check all lose it.
    in_flight = await batches.publish("inflight", 8)
    port = server.port
    server.kill()
    await wait_for(workers.all_logged("redis_unavailable"), 30, "every worker to notice the outage")
    down_until = time.monotonic() + down_s
    while time.monotonic() < down_until:  # the outage itself lasts this long; the workers must live through it
        assert not workers.dead(), workers.dead()
        await asyncio.sleep(0.2)
    server.start()
    assert server.port == port, "restarted on another port: the workers could never reach it"

    after = await batches.publish("after", 8)
    await wait_for(batches.rewarded(after + in_flight), 90, "rewards after the restart")
    assert not workers.dead(), workers.dead()
    if down_s > 5:  # arq's loop polls every 0.5 s: it met this outage through its pool's policy and lived
        for i in range(N_WORKERS):
            assert '"client":"arq"' in workers.log(i), workers.log(i)[-3000:]
    got = await batches.verdicts(before + in_flight + after)
    assert got == expected_verdicts(before + in_flight + after)
    await wait_for(workers.health_checks_pass, 60, "arq --check to pass after the restart")

    workers.stop_drained(timeout_s=90)


@pytest.mark.timeout(400)
async def test_workers_ride_out_a_redis_restart_and_drain_on_sigterm(server, workers):
    await ride_out_one_restart(server, workers, Batches(server.url, Keys("restart")), down_s=1)


@pytest.mark.timeout(400)
async def test_workers_ride_out_an_outage_longer_than_arqs_own_retries(server, workers):
    await ride_out_one_restart(server, workers, Batches(server.url, Keys("restart")), down_s=ARQ_OWN_PATIENCE_S + 5)


@pytest.mark.timeout(300)
async def test_workers_drain_and_exit_0_when_redis_is_still_down_at_sigterm(server, workers):
    batches = Batches(server.url, Keys("restart"))
    await wait_for(workers.all_logged("verifier_pool_started"), 120, "every worker to start its sandboxes")
    before = await batches.publish("before", 4)
    await wait_for(batches.rewarded(before), 60, "rewards before the outage")
    server.kill()
    await wait_for(workers.all_logged("redis_unavailable"), 30, "every worker to notice the outage")
    started = time.monotonic()
    workers.stop_drained(timeout_s=90)
    took_s = time.monotonic() - started
    print(f"stopped {N_WORKERS} workers with Redis down in {took_s:.1f} s")
