"""A finished local run, opened for inspection from its run directory.

A local run (`python -m trainer` without `--redis-url`) keeps its Redis data in `<run dir>/redis` and
stops that server when it ends, so the URL it printed leads nowhere afterwards. `FinishedRun` copies the
data files to a temporary folder, starts a private redis-server on the copy (the binary that wrote them,
streams.embedded), and removes both on exit: whatever `ops` does (`dlq purge` included) never touches the
run directory. A copy's folder names the pid that made it: one left by an `ops` killed with SIGKILL (its
server dies with it) is removed by the next `FinishedRun`. A run directory whose run is still going (its
`.lock`, trainer.local) is refused with how to reach the live server instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

import redis

from streams.embedded import EmbeddedRedis, RedisDataMismatch, RedisNotFound

DATA = "redis"
COPY_PREFIX = "proofstream-finished-"  # + "<pid>-" + mkdtemp's letters, in the temporary folder
LOCK = ".lock"  # trainer.local.DATA_LOCK: held by a live local pipeline (ops imports no role)
_SKIP = {LOCK, "redis.log"}


def remove_orphaned_copies() -> list[Path]:
    """Remove the copies whose `ops` process is gone (a pid that does not exist); the ones removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{COPY_PREFIX}*-*"):
        pid = folder.name[len(COPY_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue  # an older name without the pid: whose it is cannot be told
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except PermissionError:
            pass  # alive, another user's
    return removed


class NotARunDir(ValueError):
    """The directory holds no local run's Redis data, or its run is still going."""


class FinishedRun:
    """`with FinishedRun(run_dir) as run: run.url, run.run_id`."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir).expanduser()
        self.url = ""
        self.run_id: str | None = None  # the run whose keys the data holds (None: none or several)
        self._copy: Path | None = None
        self._server: EmbeddedRedis | None = None

    def __enter__(self) -> FinishedRun:
        data = self.run_dir / DATA
        if not (data / "appendonlydir").is_dir() and not (data / "dump.rdb").is_file():
            raise NotARunDir(
                f"{self.run_dir} holds no Redis data ({data}): not the directory of a local run (a run "
                "started with --redis-url keeps its data in that Redis: point ops there with --redis-url)"
            )
        remove_orphaned_copies()
        self._copy = Path(tempfile.mkdtemp(prefix=f"{COPY_PREFIX}{os.getpid()}-"))
        try:
            self._copy_data(data, self._copy / DATA)
            self._server = EmbeddedRedis(data_dir=self._copy / DATA).start()
            self.url = self._server.url
            self.run_id = self._only_run()
        except (RedisNotFound, RedisDataMismatch, RuntimeError) as e:
            self.__exit__(None, None, None)
            raise NotARunDir(f"cannot open the Redis data of {self.run_dir}: {e}") from e
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.kill()  # a copy: nothing of it needs flushing
            self._server = None
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)
            self._copy = None

    def _copy_data(self, data: Path, to: Path) -> None:
        """Copy under the run's lock: a live pipeline holds it, and one starting now waits for no copy."""
        lock = os.open(data / LOCK, os.O_RDONLY) if (data / LOCK).exists() else None
        try:
            if lock is not None:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise NotARunDir(
                        f"{self.run_dir} belongs to a run that is still going: inspect it live with the URL its "
                        "trainer printed (`trainer: local pipeline on redis://...`, also in its log) as --redis-url"
                    ) from None
            shutil.copytree(data, to, ignore=lambda _dir, names: [n for n in names if n in _SKIP])
        finally:
            if lock is not None:
                os.close(lock)

    def _only_run(self) -> str | None:
        """The run id of the keys the data holds: from report.json, else from the keys themselves."""
        try:
            run = json.loads((self.run_dir / "report.json").read_text())["settings"]["run"]
            if isinstance(run, str) and run:
                return run
        except (OSError, ValueError, KeyError, TypeError):
            pass
        client = redis.Redis.from_url(self.url)
        try:
            runs = {key.split(b"}", 1)[0][len(b"{ps:") :].decode() for key in client.scan_iter(match="{ps:*}:*")}
        finally:
            client.close()
        return runs.pop() if len(runs) == 1 else None
