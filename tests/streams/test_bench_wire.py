"""`python -m ops bench wire` end to end on a small N: every attempt comes back as a reward on each side
(the bench would wait forever otherwise, so it runs in a subprocess with a time limit)."""

from __future__ import annotations

import subprocess
import sys

import orjson


def test_bench_wire_sends_every_attempt_through_both_sides(system_redis_server):
    small = ["--json", "--n", "600", "--batch", "100", "--rounds", "1"]
    argv = [sys.executable, "-m", "ops", "--redis-url", system_redis_server.url, "bench", "wire", *small]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    result = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert result["bench"] == "wire" and result["n"] == 600
    assert result["attempts_per_s"] > 0 and result["baseline_per_s"] > 0 and result["ratio"] > 0


def test_bench_wire_with_a_replica_compares_waiting_for_it_with_not_waiting():
    small = ["--json", "--n", "600", "--batch", "100", "--rounds", "1"]
    argv = [sys.executable, "-m", "ops", "bench", "wire", "--replica", *small]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=True)
    result = orjson.loads(done.stdout.strip().splitlines()[-1])
    assert result["bench"] == "wire-wait" and result["replicas_in_sync"] == 1
    assert result["attempts_per_s"] > 0 and result["no_wait_per_s"] > 0 and result["ratio"] > 0
