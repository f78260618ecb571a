"""Host uids for process sandboxes, one per sandbox, leased through lock files.

Why a uid of its own: RLIMIT_NPROC counts the processes of a uid host-wide and does not bind uid 0, so
sandboxes that share a uid share one process quota (a neighbour's fork bomb then stalls every restart),
and sandboxes run as root have none. A root worker therefore gives each sandbox an unprivileged uid from
a range no account uses. The lease is an flock on `<lock_dir>/<uid>`: the kernel releases it when the
holder dies, however it dies, so two workers on one host never hold the same uid and a crashed worker's
uids come back by themselves. A uid that still has processes (a sandbox that outlived a worker) is skipped.
"""

from __future__ import annotations

import fcntl
import os
import random
import stat
from dataclasses import dataclass

from verifier_pool.sandbox import SandboxUnavailable

DEFAULT_UID_BASE = 1_600_000  # above the ranges of /etc/subuid's defaults (100000 + 65536 per user)
DEFAULT_UID_COUNT = 4096


@dataclass
class UidLease:
    uid: int
    fd: int | None  # holds the flock; closing it ends the lease

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def lease(lock_dir: str, base: int = DEFAULT_UID_BASE, count: int = DEFAULT_UID_COUNT) -> UidLease:
    """A uid in [base, base + count) that no other lease holds and no process runs as. Needs root."""
    _ensure_private_dir(lock_dir)
    busy = _uids_with_processes()
    offset = random.randrange(count)  # workers starting together then rarely try the same lock first
    for i in range(count):
        uid = base + (offset + i) % count
        if uid in busy:
            continue
        fd = os.open(os.path.join(lock_dir, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if uid in _uids_with_processes():  # started between the scan and the lock
            os.close(fd)
            continue
        return UidLease(uid, fd)
    raise SandboxUnavailable(f"all {count} sandbox uids from {base} are leased or busy (lock dir {lock_dir})")


def _ensure_private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    # Anyone who could write here could hold every lock (no sandbox would start) or plant symlinks.
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SandboxUnavailable(f"{path} must be a directory owned by uid {os.geteuid()}, writable only by it")


def _uids_with_processes() -> set[int]:
    uids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uids.add(os.stat(f"/proc/{entry}").st_uid)  # the owner of /proc/<pid> is its effective uid
            except OSError:
                continue  # exited meanwhile
    return uids
