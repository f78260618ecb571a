"""One trainer per run (trainer/lease.py) on a real Redis: a second trainer is refused with the holder's name,
a holder that died on this host is taken over at once, a lease taken from under its holder stops it, and a
finished run refuses to "resume" (python -m trainer exits 3 and says what to do), and a run directory whose
Redis lost the run is an error, not a fresh start."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from streams.keys import Keys
from trainer.lease import TrainerLease, TrainerRunning
from trainer.run_state import FINISHED_BEFORE

ROOT = Path(__file__).resolve().parents[2]
KEYS = Keys("leased")


async def test_a_second_lease_is_refused_with_the_holders_name_until_the_first_is_released(one_redis):
    first = TrainerLease(one_redis, KEYS, ttl_s=0.6)
    await first.acquire()
    second = TrainerLease(one_redis, KEYS, ttl_s=0.6)
    started = time.monotonic()
    with pytest.raises(TrainerRunning, match=f"already has a trainer: {socket.gethostname()}"):
        await second.acquire()  # the holder renewed it for longer than a TTL: alive
    assert time.monotonic() - started >= 0.6
    assert orjson.loads(await one_redis.get(KEYS.trainer_lease))["token"] == first.holder["token"]
    await first.release()
    assert await one_redis.get(KEYS.trainer_lease) is None
    await second.acquire()  # free: at once
    await second.release()


async def test_a_holder_that_died_on_this_host_is_taken_over_at_once(one_redis):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid no longer exists (and is not reused within the test)
    dead = {"host": socket.gethostname(), "pid": gone.pid, "token": "old", "since": 0}
    await one_redis.set(KEYS.trainer_lease, orjson.dumps(dead), px=60_000)
    lease = TrainerLease(one_redis, KEYS, ttl_s=30)
    started = time.monotonic()
    await lease.acquire()
    assert time.monotonic() - started < 1  # no wait for the dead holder's 60 s
    assert orjson.loads(await one_redis.get(KEYS.trainer_lease))["token"] == lease.holder["token"]
    await lease.release()
    elsewhere = {**dead, "host": "another-host"}  # a pid on another host cannot be judged: wait, then refuse
    await one_redis.set(KEYS.trainer_lease, orjson.dumps(elsewhere), px=60_000)
    with pytest.raises(TrainerRunning, match="another-host"):
        await TrainerLease(one_redis, KEYS, ttl_s=0.3).acquire()


async def test_a_lease_taken_from_under_its_holder_says_so(one_redis):
    lease = TrainerLease(one_redis, KEYS, ttl_s=0.3)
    await lease.acquire()
    await one_redis.set(KEYS.trainer_lease, orjson.dumps({"host": "usurper", "pid": 1}), px=60_000)
    await asyncio.wait_for(lease.lost.wait(), 5)
    await lease.release()  # gives back only its own lease
    assert orjson.loads(await one_redis.get(KEYS.trainer_lease))["host"] == "usurper"


def _trainer(url: str, run: str, run_dir: Path, iterations: int, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "trainer", "--redis-url", url, "--run", run, "--algo", "es"]
    argv += ["--iterations", str(iterations), "--population", "4", "--batch", "2", "--problems", "12"]
    argv += ["--held-out", "2", "--eval-every", "0", "--run-dir", str(run_dir), "--log-level", "warning"]
    argv += ["--quorum", "1", *extra]  # lockstep: exact sample counts (at 0.75 an update may take 3 of 4)
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_second_trainer_is_refused_and_a_finished_or_lost_run_is_not_resumed_silently(one_redis_url, tmp_path):
    import redis as redis_sync

    r = redis_sync.Redis.from_url(one_redis_url)
    r.set(Keys("twice").trainer_lease, orjson.dumps({"host": "another-host", "pid": 7, "since": 0}), px=60_000)
    refused = _trainer(one_redis_url, "twice", tmp_path / "a", 2, "--lease-s", "0.5")
    assert refused.returncode == 1 and "run 'twice' already has a trainer: another-host pid 7" in refused.stderr
    assert r.hget(Keys("twice").trainer_state, "state") is None  # it touched nothing of the run
    r.delete(Keys("twice").trainer_lease)
    roles = subprocess.Popen([sys.executable, "-m", "tests.fixtures.fake_roles", one_redis_url, "twice"], cwd=ROOT)
    try:
        done = _trainer(one_redis_url, "twice", tmp_path / "a", 2)
        assert done.returncode == 0, done.stderr[-3000:]
        assert r.get(Keys("twice").trainer_lease) is None  # given back at the end
        again = _trainer(one_redis_url, "twice", tmp_path / "a", 2)
        assert again.returncode == FINISHED_BEFORE, again.stderr[-3000:]
        assert "run 'twice' finished at version 2 (16 training samples)" in again.stderr
        assert "--iterations N with N > 2" in again.stderr
        more = _trainer(one_redis_url, "twice", tmp_path / "a", 3)
        assert more.returncode == 0, more.stderr[-3000:]
        assert "continuing the finished run 'twice' at version 2 of 3 (16 training samples so far" in more.stderr
    finally:
        roles.terminate()
        roles.wait(30)
    state = orjson.loads(r.hget(Keys("twice").trainer_state, "state"))
    assert state["version"] == 3 and state["finished"] and state["counts"]["samples"] == 24
    r.delete(Keys("twice").trainer_state)  # the run's Redis data lost: the directory must not start over
    lost = _trainer(one_redis_url, "twice", tmp_path / "a", 4)
    assert lost.returncode == 1 and "holds run 'twice' up to version 3 (metrics.jsonl), but this Redis" in lost.stderr
    assert r.hget(Keys("twice").trainer_state, "state") is None
    r.close()
