"""`python -m ops --run-dir DIR`: a finished local run is inspected from its directory, on a copy of its Redis
data (a real redis-server started on the copy: streams/run_redis.py), and the directory is left byte for byte as
it was; a run still going, a directory without Redis data and `--redis-url` together with `--run-dir` are
refused."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import redis as redis_sync

from streams.embedded import EmbeddedRedis
from streams.run_redis import COPY_PREFIX, reopen

ROOT = Path(__file__).resolve().parents[2]


def _finished_run(run_dir: Path, run: str, rewards: int) -> None:
    """What a local run leaves: `<dir>/redis` written by an embedded server, then stopped."""
    (run_dir / "redis").mkdir(parents=True)
    (run_dir / "redis" / ".lock").touch()  # trainer.local creates it; nobody holds it once the run is over
    server = EmbeddedRedis(data_dir=run_dir / "redis").start()
    try:
        client = redis_sync.Redis.from_url(server.url)
        for i in range(rewards):
            client.xadd(f"{{ps:{run}}}:rewards", {"v": "1", "attempt_id": f"a{i}"})
        client.xadd(f"{{ps:{run}}}:dlq", {"v": "1", "reason": "poison: statement missing"})
        client.close()
    finally:
        server.stop()


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _ops(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_a_finished_run_is_read_from_its_directory_which_stays_as_it_was(tmp_path):
    _finished_run(tmp_path, "exp-7", rewards=5)
    before = _snapshot(tmp_path)
    done = _ops("streams", "--json", "--run-dir", str(tmp_path))  # the run id comes from the data itself
    assert done.returncode == 0, done.stderr
    streams = json.loads(done.stdout)["streams"]
    assert json.loads(done.stdout)["run"] == "exp-7"
    assert streams["rewards"]["length"] == 5 and streams["dlq"]["length"] == 1
    purged = _ops("dlq", "purge", "--all", "--yes", "--run-dir", str(tmp_path))  # on the copy only
    assert purged.returncode == 0, purged.stderr
    assert _snapshot(tmp_path) == before
    again = _ops("dlq", "list", "--json", "--run-dir", str(tmp_path))
    assert json.loads(again.stdout)["length"] == 1
    other = _ops("streams", "--json", "--run", "elsewhere", "--run-dir", str(tmp_path))  # --run still wins
    assert json.loads(other.stdout)["streams"]["rewards"]["length"] == 0


def test_open_serves_the_copy_for_redis_cli_until_sigterm(tmp_path):
    _finished_run(tmp_path, "exp-8", rewards=3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops", "open", "--json", "--run-dir", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        shown = json.loads(proc.stdout.readline())
        assert shown["run"] == "exp-8"
        cli = subprocess.run(
            ["redis-cli", "-u", shown["redis_url"], "XLEN", "{ps:exp-8}:rewards"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        assert cli.stdout.strip() == "3"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    with pytest.raises(redis_sync.ConnectionError):  # the copy's server went with it
        redis_sync.Redis.from_url(shown["redis_url"], socket_connect_timeout=1).ping()


def test_a_run_still_going_a_folder_without_data_and_two_sources_are_refused(tmp_path):
    _finished_run(tmp_path / "live", "exp-9", rewards=1)
    with open(tmp_path / "live" / "redis" / ".lock") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # what a live local pipeline holds
        live = _ops("streams", "--run-dir", str(tmp_path / "live"))
    assert live.returncode == 2 and "still going" in live.stderr and "--redis-url" in live.stderr
    (tmp_path / "empty").mkdir()
    empty = _ops("streams", "--run-dir", str(tmp_path / "empty"))
    assert empty.returncode == 2 and "holds no Redis data" in empty.stderr
    both = _ops("streams", "--run-dir", str(tmp_path / "live"), "--redis-url", "redis://127.0.0.1:1/0")
    assert both.returncode == 2 and "not both" in both.stderr
    assert _ops("open").returncode == 2


def test_the_run_id_comes_from_report_json_when_there_is_one(tmp_path):
    _finished_run(tmp_path, "from-keys", rewards=1)
    (tmp_path / "report.json").write_text(json.dumps({"settings": {"run": "from-report"}}))
    with reopen(tmp_path) as run:
        assert run.only_run() == "from-report" and run.url.startswith("redis://127.0.0.1:") and run.copy


def test_a_copy_left_by_an_open_killed_with_sigkill_is_removed_by_the_next(tmp_path):
    _finished_run(tmp_path, "exp-9", rewards=2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ops", "open", "--json", "--run-dir", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert json.loads(proc.stdout.readline())["run"] == "exp-9"
        copies = list(Path(tempfile.gettempdir()).glob(f"{COPY_PREFIX}{proc.pid}-*"))
        assert len(copies) == 1 and (copies[0] / "redis").is_dir()
    finally:
        proc.kill()  # SIGKILL: no cleanup of its own
        proc.wait(timeout=30)
    assert copies[0].exists()
    mine = Path(tempfile.mkdtemp(prefix=f"{COPY_PREFIX}{os.getpid()}-"))  # a live process's copy stays
    try:
        with reopen(tmp_path) as run:
            assert run.only_run() == "exp-9"
        assert not copies[0].exists() and mine.exists()
    finally:
        shutil.rmtree(mine, ignore_errors=True)
