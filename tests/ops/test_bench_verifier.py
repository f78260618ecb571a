"""`python -m ops bench verifier`: a short run per available backend, on a real Redis and real sandboxes.

Its figures are measurements (docs/PERFORMANCE.md), so the tests assert what holds on any machine: the
verdicts are the solutions', every re-published attempt is a cache hit, a sandbox is never busier than the
wall clock, every hang was followed by a restart; and that the bench refuses to report figures when the
pool's verdicts or its cache are wrong."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis as redis_sync

from ops.bench import verifier as bench_verifier
from ops.cli import build_parser, main
from tasks.countdown_check import check
from verifier_pool import docker_daemon, process
from verifier_pool.sandbox_config import CHECKER_IMAGE

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--sandboxes", "2", "--attempts", "200", "--cache-hits", "400", "--hangs", "3"]
KEYS = {
    "proofs_per_s",
    "utilization",
    "utilization_from_rewards",
    "restart_ms_p50",
    "restart_ms_p90",
    "restart_ms",
    "cache_hits_per_s",
    "cache_hits",
    "verdicts",
    "window_s",
    "window_rewards",
    "load_avg_1m_before",
}

_NO_DOCKER = docker_daemon.why_unavailable(CHECKER_IMAGE)
BACKENDS = [
    pytest.param("process", marks=pytest.mark.skipif(process.available() is None, reason="no bwrap or unshare")),
    pytest.param("docker", marks=pytest.mark.skipif(_NO_DOCKER is not None, reason=f"docker: {_NO_DOCKER}")),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_short_run_reports_sane_figures_and_leaves_nothing_behind(backend, one_redis_url, tmp_path):
    out = tmp_path / "bench.json"
    argv = [sys.executable, "-m", "ops", "bench", "verifier", "--backend", backend, *SHORT]
    argv += ["--redis-url", one_redis_url, "--out", str(out), "--json"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    result = json.loads(line)
    assert out.read_text().strip() == line
    assert result.keys() >= KEYS and result["bench"] == "verifier" and result["backend"] == backend
    # Attempts 0, 4, 8, ... carry their problem's solution; the rest add a number they were not given.
    assert result["verdicts"] == {"proved": 50, "rejected": 150}
    assert result["cache_hits"] == 400 and result["cache_hits_per_s"] > 0 and result["proofs_per_s"] > 0
    # The backlog appeared at once (one MULTI): the window saw it all but the few rewards of its last round
    # (up to one per consumer task) and those that beat the clock's first reading: a settle per task at most,
    # which for cache hits is a whole read (a batch of 16, settled in one script, can land in under a ms).
    tasks, batch = 2 * 2, 16
    assert 200 - 2 * tasks <= result["window_rewards"]["checks"] <= 200
    assert 400 - tasks * (batch + 1) <= result["window_rewards"]["cache"] <= 400
    # Busy time is measured inside the window (its edges may add one check per sandbox), never more than it.
    assert 0 < result["utilization"] <= 1.05
    assert result["utilization"] <= result["utilization_from_rewards"] * 1.01  # an upper bound: plus the cache store
    restart_ms = result["restart_ms"]
    assert len(restart_ms) == 3 and all(0 < ms < 60_000 for ms in restart_ms)
    assert min(restart_ms) <= result["restart_ms_p50"] <= result["restart_ms_p90"] <= max(restart_ms)
    r = redis_sync.Redis.from_url(one_redis_url)
    assert r.keys("{ps:bench-verifier-*") == []  # nothing left in a Redis the bench did not own
    r.close()


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, parent, ...), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _alive(pid: int) -> bool:
    return (fields := _stat(pid)) is not None and fields[0] != "Z"


def _descendants(pid: int) -> list[int]:
    """Live processes below `pid` (the private redis-server, bwrap and the checkers under it)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None and fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, its_parent in parents.items() if its_parent == parent]
        found += children
        todo += children
    return found


@pytest.mark.skipif(process.available() is None, reason="no bwrap or unshare")
def test_sigterm_mid_run_stops_the_pool_and_leaves_no_process_behind():
    """As Ctrl-C in a terminal: the pool drains, its sandboxes are killed, the private Redis stops."""
    argv = [sys.executable, "-m", "ops", "bench", "verifier"]
    argv += ["--backend", "process", "--sandboxes", "2", "--attempts", "20000", "--log-level", "info", "--json"]
    bench = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in bench.stderr:  # the pool is up and checking once its first verdict is logged
            if '"verified"' in line:
                break
        started = _descendants(bench.pid)
        bench.send_signal(signal.SIGTERM)
        _out, stderr = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.communicate()
    assert bench.returncode == 130, stderr[-2000:]
    assert len(started) >= 3  # redis-server and two sandboxes (bwrap and its checker)
    deadline = time.monotonic() + 10  # a killed process may take a moment to be reaped by its parent
    while (left := [p for p in started if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []


def test_the_work_is_what_the_verdicts_are_checked_against():
    attempts, problems = bench_verifier.attempts_for(40, "t")
    by_id = {p.theorem_id: p for p in problems}
    oks = [check(by_id[a.theorem_id].numbers, by_id[a.theorem_id].target, a.proof).ok for a in attempts]
    assert oks == [i % 4 == 0 for i in range(40)]
    assert len({a.proof for a in attempts}) == 40  # no attempt is a cache hit of another


def _run(args) -> int:
    """What `python -m ops bench verifier` does with the parsed flags, in this process."""
    return args.func(args)


def _bench_args(one_redis_url: str, *extra: str):
    argv = ["bench", "verifier", "--backend", "process", "--sandboxes", "1", "--attempts", "40"]
    argv += ["--cache-hits", "40", "--hangs", "1", "--redis-url", one_redis_url, "--json", *extra]
    return build_parser().parse_args(argv)


@pytest.mark.skipif(process.available() is None, reason="no bwrap or unshare")
def test_verdicts_that_are_not_the_solutions_fail_the_bench(one_redis_url, monkeypatch, capsys):
    real_register = bench_verifier.register

    async def off_by_one(redis, keys, theorems):  # the canonical targets the pool checks against, all moved
        await real_register(redis, keys, [dataclasses.replace(t, target=t.target + 1) for t in theorems])

    monkeypatch.setattr(bench_verifier, "register", off_by_one)
    assert _run(_bench_args(one_redis_url)) == 1
    assert "verdicts are not the solutions'" in capsys.readouterr().err


@pytest.mark.skipif(process.available() is None, reason="no bwrap or unshare")
def test_a_cache_that_misses_fails_the_bench(one_redis_url, monkeypatch, capsys):
    real_backlog = bench_verifier.backlog
    phases = []

    async def forgetting(redis, service, attempts, timeout_s):
        if phases:  # before the cache phase: the verdicts are gone, so every attempt is checked again
            await redis.delete(service.keys.verdicts)
        phases.append(len(attempts))
        return await real_backlog(redis, service, attempts, timeout_s)

    monkeypatch.setattr(bench_verifier, "backlog", forgetting)
    assert _run(_bench_args(one_redis_url)) == 1
    assert "were not cache hits" in capsys.readouterr().err and phases == [40, 40]


def test_impossible_flags_are_refused_with_a_message(capsys):
    assert main(["bench", "verifier", "--sandboxes", "0"]) == 2
    assert "--sandboxes" in capsys.readouterr().err
    assert main(["bench", "verifier", "--sandboxes", "2", "--attempts", "8"]) == 2
    assert "at least 16" in capsys.readouterr().err
