"""`python -m producers` as real processes: a generator killed with SIGKILL mid-order, its order completed once
by another; and the clear errors a user sees for a missing Redis or model."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis as redis_sync

from streams.codec import decode
from streams.connect import connect
from streams.keys import GENERATORS, Keys
from streams.publisher import Publisher
from streams.schema import Attempt, WorkOrder
from streams.theorems import Theorem
from tests.producers.conftest import needs_model

ROOT = Path(__file__).resolve().parents[2]
RUN = "proc"
KEYS = Keys(RUN)


def _generator(url: str, name: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PROOFSTREAM_LOG_LEVEL": "warning"}
    argv = [sys.executable, "-m", "producers", "--redis-url", url, "--run", RUN, "--engine", "hf", "--name", name]
    argv += ["--claim-idle-ms", "2000", "--threads", "1"]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _until(predicate, timeout_s: float, what: str, procs=()):
    deadline = time.monotonic() + timeout_s
    while not (result := predicate()):
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"generator exited {p.returncode} while waiting for {what}: {p.stderr.read()}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return result


@needs_model
def test_an_order_of_a_killed_generator_completes_once_elsewhere(one_redis_url, model_path):
    r = redis_sync.Redis.from_url(one_redis_url)
    r.hset(KEYS.theorems, "cd", Theorem("cd", "countdown", numbers=[3, 5], target=8).encode())
    order = WorkOrder(
        "w-kill",
        0,
        "grpo",
        "countdown",
        ["cd"],
        samples_per_theorem=4,
        sampling={"max_new_tokens": 160, "temperature": 1.0},
        timeout_s=1,
    )

    async def publish():
        client = connect(one_redis_url)
        await Publisher(client, KEYS).publish([order])
        await client.aclose()

    asyncio.run(publish())
    first = _generator(one_redis_url, "g-first")
    survivor = None
    try:

        def taken():
            rows = r.xpending_range(KEYS.work, GENERATORS, "-", "+", 10)
            return rows and rows[0]["consumer"] == b"g-first"

        _until(lambda: r.exists(KEYS.work) and r.xinfo_groups(KEYS.work) and taken(), 120, "g-first to take", [first])
        assert r.xlen(KEYS.attempts) == 0  # mid-order: nothing published yet
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert r.xlen(KEYS.attempts) == 0, "the first generator finished before it was killed: make the order longer"
        survivor = _generator(one_redis_url, "g-second")
        _until(lambda: r.xlen(KEYS.attempts) >= 4, 180, "the order to complete elsewhere", [survivor])
        _until(lambda: r.xinfo_groups(KEYS.work)[0]["pending"] == 0, 30, "the order to be acked", [survivor])
        attempts = [decode(Attempt, f) for _, f in r.xrange(KEYS.attempts)]
        assert sorted(a.attempt_id for a in attempts) == [f"w-kill:0:{k}" for k in range(4)]
        assert r.xlen(KEYS.dlq) == 0
        survivor.send_signal(signal.SIGTERM)  # a clean stop: exits 0 with nothing in hand
        assert survivor.wait(60) == 0
    finally:
        for p in (first, survivor):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        r.close()


def test_without_redis_a_model_or_a_gpu_it_says_what_to_do(one_redis_url, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PROOFSTREAM_REDIS_URL", None)
    no_redis = subprocess.run(
        [sys.executable, "-m", "producers", "--run", RUN], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert no_redis.returncode == 2 and "--redis-url" in no_redis.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "producers", "--redis-url", one_redis_url, "--model", str(tmp_path / "nowhere")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "does not exist" in missing.stderr, missing.stderr
    bad_flag = subprocess.run(
        [sys.executable, "-m", "producers", "--engine", "tgi"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad_flag.returncode == 2 and "engine" in bad_flag.stderr
    import torch

    if not torch.cuda.is_available():  # asking for a GPU that is not there: a sentence, not a traceback
        no_gpu = subprocess.run(
            [sys.executable, "-m", "producers", "--redis-url", one_redis_url, "--device", "cuda"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert no_gpu.returncode == 2 and "--device cuda, but torch" in no_gpu.stderr, no_gpu.stderr
        assert "Traceback" not in no_gpu.stderr
