"""`arq workers.verifier` for real: a worker process against a real Redis, process sandboxes, the
Countdown checker. It answers `--check`, turns attempts into rewards, and drains on SIGTERM."""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from consumers.service import VerifierService
from streams import role_stats
from streams.codec import decode
from streams.groups import group_states
from streams.keys import VERIFIERS
from streams.publisher import Publisher
from streams.schema import Attempt, Reward
from streams.theorems import Theorem, register
from verifier_pool import process

pytestmark = pytest.mark.skipif(process.available() is None, reason="neither bubblewrap nor unshare works here")

ARQ = str(Path(sys.executable).parent / "arq")
ROOT = Path(__file__).resolve().parent.parent


def worker_env(redis_url: str, run: str) -> dict[str, str]:
    return {
        **os.environ,
        "PROOFSTREAM_REDIS_URL": redis_url,
        "PROOFSTREAM_RUN": run,
        "PROOFSTREAM_CONCURRENCY": "2",
        "PROOFSTREAM_SANDBOX": "process",
        "PROOFSTREAM_TASKS": '["countdown"]',
        "PROOFSTREAM_LOG_LEVEL": "warning",
    }


async def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)  # polls an observable condition of another process


@pytest.mark.timeout(120)
async def test_worker_checks_health_verifies_and_drains_on_sigterm(redis, redis_url, keys):
    env = worker_env(redis_url, keys.run)
    await register(redis, keys, [Theorem("cd", "countdown", numbers=[2, 3, 5], target=11)])
    worker = subprocess.Popen(
        [ARQ, "workers.verifier"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        answers = ["<answer>2*3+5</answer>", "<answer>2+3+5</answer>"] * 10
        await Publisher(redis, keys).publish(
            [
                Attempt(
                    attempt_id=f"a{i}",
                    work_id="w",
                    theorem_id="cd",
                    policy_version=0,
                    sample_index=i,
                    proof=p,
                    task="countdown",
                )
                for i, p in enumerate(answers)
            ]
        )

        async def all_rewarded() -> bool:
            return await redis.xlen(keys.rewards) == len(answers)

        await wait_for(all_rewarded, 60, "rewards")
        verdicts = sorted(decode(Reward, f).verdict for _, f in await redis.xrange(keys.rewards))
        assert verdicts == ["proved"] * 10 + ["rejected"] * 10

        async def healthy() -> bool:
            check = await asyncio.create_subprocess_exec(
                ARQ,
                "workers.verifier",
                "--check",
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            return await check.wait() == 0

        await wait_for(healthy, 30, "arq --check to pass")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        [g] = [g for g in await group_states(redis, keys.attempts) if g.name == VERIFIERS]
        assert g.outstanding == 0
        [figures] = (await role_stats.verifiers(redis, keys)).values()
        assert (figures["processed"], figures["published"]) == (20, 20)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        output = worker.stdout.read().decode(errors="replace")
    # Nothing of the worker's sandboxes outlives it (bwrap/unshare children die with their worker).
    assert "Traceback" not in output, output[-3000:]


def test_worker_without_redis_url_says_what_to_do():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
    result = subprocess.run([ARQ, "workers.verifier"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "PROOFSTREAM_REDIS_URL" in result.stderr


def dead_redis_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{s.getsockname()[1]}/0"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("argv", [["--check"], []], ids=["check", "worker"])
def test_an_unreachable_redis_fails_fast_in_one_line_not_a_traceback(argv):
    # The pool's policy waits out outages only once the worker is up (streams.ride_out): `--check` and a
    # worker's start keep arq's own patience (5 tries, 1 s apart) and then fail, saying so in one line.
    url = dead_redis_url()
    started = time.monotonic()
    result = subprocess.run(
        [ARQ, "workers.verifier", *argv],
        cwd=ROOT,
        env=worker_env(url, "dead"),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 1
    assert time.monotonic() - started < 60, "arq's own retries take ~5 s; this waited for Redis instead"
    assert f"arq workers.verifier: cannot reach Redis at {url}" in result.stderr
    assert "Traceback" not in result.stderr


async def test_sweep_and_report_skip_a_tick_while_redis_is_unreachable(monkeypatch, capsys):
    # A cron job that raises is logged by arq as a failed job with a traceback; an outage is not a failure.
    url = dead_redis_url()
    monkeypatch.setenv("PROOFSTREAM_REDIS_URL", url)
    monkeypatch.setenv("PROOFSTREAM_TASKS", '["countdown"]')
    monkeypatch.delenv("PROOFSTREAM_CONFIG", raising=False)
    workers = importlib.reload(importlib.import_module("workers"))
    service = VerifierService(workers._SETTINGS, url)
    try:
        await workers._sweep({"service": service})
        await workers._report({"service": service})
    finally:
        await service.admin.aclose()
    logged = capsys.readouterr().err
    assert '"sweep_skipped"' in logged and '"report_skipped"' in logged, logged
