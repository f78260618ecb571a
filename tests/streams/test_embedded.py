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
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
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
