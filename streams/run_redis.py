"""A local run's Redis, reopened from its run directory: the one opener of `python -m ops --run-dir`
(ops/views/finished.py) and of the evaluations (evals/runs.py).

A local run (`python -m trainer` without `--redis-url`) keeps its Redis data in `<run dir>/redis` and holds
that folder's lock (streams/run_dir.py REDIS, DATA_LOCK) while it runs; its server stops with it, so the URL
it printed leads nowhere afterwards. `reopen(run_dir)`:

- copies the data, under the lock, to a temporary folder and serves the copy with a private redis-server (the
  binary that wrote it, streams/embedded.py) until the block ends; then both go. A copy, not the server
  restarted on the run's own files: ops's commands write (`dlq requeue`, `dlq purge`, `verdicts clear`, and
  `ops open` serves the data to redis-cli), and a server on the run's AOF would write them into the run's
  record (and its log into the run's folder even when nothing is asked of it); a reader holding no lock also
  never keeps a trainer that resumes the run waiting, and two readers never share one AOF. The copy costs the
  data's size once (a run's Redis holds text and metadata, never weights).
- a run still going (the lock held by someone else): with `live=True`, for readers that only read (the
  evaluations), the run's own server, found by its data directory (`live_server`), is read in place; the lock
  held with no server on the data (another reader's copy, a trainer starting) is waited for. Without `live`
  (ops, whose commands may write), `RunGoing` says to use the URL the trainer printed.
- "the folder has data" is the server's own rule (streams/embedded.py `has_data`); none: `NoRunData`.

A copy's folder names the pid that made it: one left by a process killed with SIGKILL (its server dies with
it, PR_SET_PDEATHSIG) is removed by the next `reopen`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from streams.embedded import EmbeddedRedis, RedisDataMismatch, RedisNotFound, has_data
from streams.run_dir import DATA_LOCK, REDIS, REPORT, read_json

COPY_PREFIX = "proofstream-finished-"  # + "<pid>-" + mkdtemp's letters, in the temporary folder
NOT_COPIED = {DATA_LOCK, "redis.log"}
START_TIMEOUT_S = 120.0  # loading a long run's AOF takes a while


class NoRunData(ValueError):
    """The run directory holds no Redis data of a local run, or it cannot be opened; the message says why."""


class RunGoing(NoRunData):
    """The run is still going (its data's lock is held). `url`: its live server, where one was found."""

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


@dataclass(frozen=True)
class Reopened:
    """The run's Redis as `reopen` serves it: `url`, and whether it is a copy (else the live run's server)."""

    url: str
    run_dir: Path
    copy: bool

    def only_run(self) -> str | None:
        """The run id whose keys the data holds: the report's, else the one run in the keys (None: none or
        several)."""
        run = ((read_json(self.run_dir / REPORT) or {}).get("settings") or {}).get("run")
        if isinstance(run, str) and run:
            return run
        client = redis.Redis.from_url(self.url)
        try:
            runs = {key.split(b"}", 1)[0][len(b"{ps:") :].decode() for key in client.scan_iter(match="{ps:*}:*")}
        finally:
            client.close()
        return runs.pop() if len(runs) == 1 else None


@contextlib.contextmanager
def reopen(run_dir: str | Path, *, live: bool = False) -> Iterator[Reopened]:
    """The run's Redis for the block (module docstring): a served copy of its data, or with `live` the server
    of a run still going. NoRunData where it holds none, RunGoing where the run is going and `live` is off."""
    run_dir = Path(run_dir).expanduser()
    data = run_dir / REDIS
    if not has_data(data):
        raise NoRunData(
            f"{run_dir} holds no Redis data ({data}): not the directory of a local run (a run started with "
            "--redis-url keeps its data in that Redis: point at it with --redis-url)"
        )
    remove_orphaned_copies()
    copy = Path(tempfile.mkdtemp(prefix=f"{COPY_PREFIX}{os.getpid()}-"))
    try:
        url = _copy_or_live(run_dir, copy / REDIS, live)
        if url is not None:
            yield Reopened(url, run_dir, copy=False)
            return
        try:
            server = EmbeddedRedis(data_dir=copy / REDIS, start_timeout_s=START_TIMEOUT_S).start()
        except (RedisNotFound, RedisDataMismatch, RuntimeError) as e:
            raise NoRunData(f"cannot open the Redis data of {run_dir}: {e}") from e
        try:
            yield Reopened(server.url, run_dir, copy=True)
        finally:
            server.kill()  # a copy: nothing of it needs flushing
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _copy_or_live(run_dir: Path, to: Path, live: bool) -> str | None:
    """Copy the run's data to `to` under its lock and return None; or, the lock being held by a live run,
    its server's URL (`live`) or RunGoing. A folder without a lock file was never run by a pipeline that
    holds one: it is copied as it is (and left without one: reading creates nothing in the run directory)."""
    data = run_dir / REDIS
    lock = os.open(data / DATA_LOCK, os.O_RDONLY) if (data / DATA_LOCK).exists() else None
    try:
        if lock is not None and not _locked(lock):
            url = live_server(data)
            if url is not None and live:
                return url
            if url is not None or not live:
                raise RunGoing(
                    f"{run_dir} belongs to a run that is still going: inspect it live with the URL its trainer "
                    "printed (`trainer: local pipeline on redis://...`, also in its log) as --redis-url",
                    url,
                )
            # No server on it: another reader's copy, or a trainer starting. Either takes a moment.
            print(f"waiting for another process using {data} (a reader's copy, or a trainer starting)", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.copytree(data, to, ignore=lambda _dir, names: [n for n in names if n in NOT_COPIED])
    finally:
        if lock is not None:
            os.close(lock)
    return None


def _locked(fd: int) -> bool:
    """Take the lock without waiting; False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def live_server(data_dir: Path) -> str | None:
    """URL of a redis-server running on `data_dir` (its working directory), if any. Its argv is replaced by
    its process title, `redis-server HOST:PORT`, which gives the address."""
    want = data_dir.resolve()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().strip() != "redis-server" or Path(os.readlink(proc / "cwd")) != want:
                continue
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:  # gone meanwhile, a zombie, or not ours to read
            continue
        host, _, port = title.rsplit(" ", 1)[-1].rpartition(":")
        if not port.isdigit():
            raise RunGoing(
                f"a redis-server (pid {proc.name}) serves {data_dir}, at an address its title {title!r} does not "
                "give; pass --redis-url"
            )
        return f"redis://{'127.0.0.1' if host in ('', '*', '0.0.0.0', '::') else host}:{port}/0"
    return None


def remove_orphaned_copies() -> list[Path]:
    """Remove the copies whose process is gone (a pid that does not exist); the ones removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{COPY_PREFIX}*-*"):
        pid = folder.name[len(COPY_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue  # a name without the pid: whose it is cannot be told
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except PermissionError:
            pass  # alive, another user's
    return removed
