"""`python -m trainer` on embedded defaults: it starts a private Redis, a generator and a verifier, runs,
and leaves nothing running, whether it finishes or is interrupted with Ctrl-C (SIGINT). Real model (hf
engine, tiny generations), real verifier worker with the Countdown checker in a sandbox."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from tests.producers.conftest import needs_model

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not running, only not yet reaped by its parent
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"


def _trainer(run_dir: Path, iterations: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "trainer", "--algo", "es", "--task", "countdown", "--run", "local",
            "--run-dir", str(run_dir), "--iterations", str(iterations), "--population", "2", "--batch", "2",
            "--problems", "8", "--held-out", "2", "--eval-every", "1", "--max-new-tokens", "8", "--engine", "hf",
            "--sandbox", "process", "--log-level", "warning"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@needs_model
def test_the_local_run_finishes_and_stops_all_its_children(tmp_path):
    proc = _trainer(tmp_path, iterations=2)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert report["version"] == 2 and not report["interrupted"]
    names = sorted(c["name"] for c in report["children"])
    assert names == ["generator", "redis-server", "verifier-0"]
    assert not [c for c in report["children"] if _alive(c["pid"])]
    assert f"report {tmp_path / 'report.json'}" in err and "reward.png" in err
    evals = [r for r in map(orjson.loads, (tmp_path / "metrics.jsonl").read_bytes().splitlines()) if r.get("eval")]
    assert {e["version"] for e in evals} >= {0, 2} and all(e["problems"] == 2 for e in evals)


@needs_model
def test_ctrl_c_stops_the_local_run_and_every_child(tmp_path):
    proc = _trainer(tmp_path, iterations=50)
    deadline = time.monotonic() + 300
    while not (tmp_path / "metrics.jsonl").exists():  # the pipeline has produced something: mid-run
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never produced a metric"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    report = orjson.loads((tmp_path / "report.json").read_bytes())
    assert report["interrupted"] and len(report["children"]) == 3
    assert not [c for c in report["children"] if _alive(c["pid"])]
