"""`python -m ops bench pipeline` end to end: the real ES trainer, a real Redis and real role processes,
a few seconds of synthetic latencies. Its figures are measurements (docs/PERFORMANCE.md), so only what physics
guarantees is asserted: no run beats its slowest stage, and the stages in series take longer than overlapped.
And whatever happens (done, Ctrl-C, a role that dies), no role process outlives the bench."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis as redis_sync

from ops.bench.pipeline import figures
from ops.cli import main

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--gen-ms", "10", "--verify-ms", "8", "--population", "4", "--batch", "6", "--warmup", "2"]
FIELDS = {
    "iteration_s",
    "ideal_s",
    "sequential_s",
    "efficiency",
    "bottleneck",
    "stage_s",
    "efficiency_factors",
    "utilization",
    "attempts_per_version",
    "members_per_version",
    "latency_ms_measured",
}


@pytest.fixture
def run_bench():
    """Starts `python -m ops bench pipeline ARGV --json`; a bench still running when the test ends gets SIGTERM,
    which it handles as Ctrl-C (its roles stopped), then SIGKILL."""
    started: list[subprocess.Popen] = []

    def start(*argv: str) -> subprocess.Popen:
        # SIGINT at its default: a shell that runs the suite in the background would leave it ignored.
        bench = subprocess.Popen(
            [sys.executable, "-m", "ops", "bench", "pipeline", *argv, "--json"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        started.append(bench)
        return bench

    yield start
    for bench in started:
        if bench.poll() is None:
            bench.terminate()
            try:
                bench.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                bench.kill()
                bench.communicate()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes whose parent is `pid`."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
    return [(p, cmd) for p, cmd in out if _alive(p)]


def _roles_once_a_version_is_out(bench: subprocess.Popen) -> list[int]:
    """Reads the bench's log (--log-level info) until its trainer has published a version: by then every
    role is running. Returns their pids."""
    for line in bench.stderr:
        if '"es_update"' in line:
            return [p for p, cmd in _children(bench.pid) if "ops.bench.pipeline_roles" in cmd]
    raise AssertionError(f"the bench ended before its first update: {bench.communicate(timeout=30)}")


def test_a_short_run_reports_what_physics_allows_and_leaves_nothing_behind(run_bench, one_redis_url, tmp_path):
    trace = tmp_path / "trace.json"
    bench = run_bench(*SHORT, "--versions", "6", "--redis-url", one_redis_url, "--trace-out", str(trace))
    out, err = bench.communicate(timeout=120)
    assert bench.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result.keys() >= FIELDS and result["bench"] == "pipeline" and result["versions"] == 6
    assert 0 < result["efficiency"] <= 1.1  # no overlap beats the slowest stage (1.1: the window's ends)
    assert result["efficiency"] == pytest.approx(result["ideal_s"] / result["iteration_s"], abs=1e-3)
    assert result["sequential_s"] > result["ideal_s"] > 0  # both stages loaded: series costs more
    assert result["bottleneck"] == "generate" and result["ideal_s"] == result["stage_s"]["generate"]
    assert math.prod(result["efficiency_factors"].values()) == pytest.approx(result["efficiency"], rel=0.05)
    # The latencies were real waiting, never shorter than asked; the work per version was whole members.
    assert result["latency_ms_measured"]["generate"] >= 10 * 0.999
    assert result["latency_ms_measured"]["verify"] >= 8 * 0.999
    assert result["attempts_per_version"] == pytest.approx(6 * result["members_per_version"])
    recorded = json.loads(trace.read_text())
    pids = [r["pid"] for r in recorded["roles"]]
    assert len(pids) == 2 and not any(_alive(p) for p in pids)
    assert [u["version"] for u in recorded["updates"]] == list(range(1, 9))
    r = redis_sync.Redis.from_url(one_redis_url)
    assert r.keys("{ps:bench-pipeline-*") == []  # the run's keys are gone from a Redis the bench did not own
    r.close()


def test_ctrl_c_stops_every_process_the_bench_started(run_bench):
    bench = run_bench(*SHORT, "--versions", "10000", "--log-level", "info")
    roles = _roles_once_a_version_is_out(bench)
    started = [p for p, _ in _children(bench.pid)]  # the roles and the private redis-server
    bench.send_signal(signal.SIGINT)
    bench.communicate(timeout=60)
    assert bench.returncode == 130
    assert len(roles) == 2 and len(started) == 3 and set(roles) <= set(started)
    assert not any(_alive(p) for p in started)


def test_a_role_that_dies_mid_run_stops_the_bench_with_its_status(run_bench, one_redis_url):
    bench = run_bench(*SHORT, "--versions", "10000", "--redis-url", one_redis_url, "--log-level", "info")
    roles = _roles_once_a_version_is_out(bench)
    os.kill(roles[0], signal.SIGKILL)
    _out, err = bench.communicate(timeout=60)
    assert bench.returncode == 1
    assert "exited with status -9" in err
    assert not any(_alive(p) for p in roles)


ARGS = dict(
    warmup=1,
    versions=2,
    generators=1,
    verifier_slots=1,
    gen_ms=10,
    verify_ms=5,
    train_ms=0,
    population=4,
    batch=2,
    quorum=0.75,
    max_staleness=1,
)


def _recorded(update_busy_s: float) -> tuple[list[dict], list[dict]]:
    """Three updates a second apart (window [0, 2], two versions of 8 attempts used each), one generator
    that generated 16 attempts a version at 12.5 ms each (its last call cut by the window's end) and one
    verifier slot that checked 8 a version at 6.25 ms each."""
    updates = [
        {
            "at": float(t),
            "busy_s": update_busy_s,
            "attempts": 8,
            "members": 4,
            "staleness": {"1": 4},
            "stale_dropped": 0,
        }
        for t in range(3)
    ]
    generator = {
        "role": "generator",
        "lanes": [[[0.1, 0.3, 16], [1.1, 1.3, 16], [1.9, 2.1, 16]]],
        "counts": {"stale_skipped": 0},
        "held_for_room_s": 0.0,
    }
    verifier = {"role": "verifier", "lanes": [[[0.5, 0.55, 8], [1.5, 1.55, 8]]]}
    return updates, [generator, verifier]


def test_figures_are_the_slowest_stage_the_sum_of_stages_and_their_ratio():
    out = figures(*_recorded(update_busy_s=0.01), argparse.Namespace(**ARGS))
    assert out["iteration_s"] == 1.0 and out["versions"] == 2
    # per version: 8 attempts x 10 ms on one generator, 8 x 5 ms on one slot, the updates as measured
    assert out["stage_s"] == {"generate": 0.08, "verify": 0.04, "train": 0.01}
    assert out["ideal_s"] == 0.08 and out["bottleneck"] == "generate" and out["sequential_s"] == 0.13
    assert out["efficiency"] == 0.08
    # The generator: busy 0.5 s of the 2 s window (0.1 s of its last call), 40 attempts in it (8 of the last
    # call's 16), 8 used a version of 20, and 12.5 ms each for 10 asked: 0.25 x 0.4 x 0.8 = the efficiency.
    assert out["processed_per_version"] == {"generate": 20.0, "verify": 8.0}
    assert out["efficiency_factors"] == {"busy": 0.25, "kept": 0.4, "latency": 0.8}
    assert out["utilization"] == {"generate": 0.25, "verify": 0.05, "train": 0.01}
    assert out["latency_ms_measured"] == {"generate": 12.5, "verify": 6.25}
    assert out["idle_between_calls_ms"] == {"generate": 700.0, "verify": 950.0}  # gaps 0.8, 0.6 s; 0.95 s


def test_a_trainer_slower_than_both_stages_is_the_bottleneck():
    out = figures(*_recorded(update_busy_s=0.5), argparse.Namespace(**ARGS))
    assert out["bottleneck"] == "train" and out["ideal_s"] == 0.5 and out["sequential_s"] == 0.62
    assert out["efficiency"] == 0.5 and out["efficiency_factors"] == {"busy": 0.5, "kept": 1.0, "latency": 1.0}


def test_impossible_flags_are_refused_with_a_message(capsys):
    assert main(["bench", "pipeline", "--versions", "1"]) == 2
    assert "--versions at least 2" in capsys.readouterr().err
