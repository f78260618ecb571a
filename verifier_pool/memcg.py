"""A memory cgroup per process sandbox, where the host lets the worker make one: the kernel's own cap on
the whole tree (anonymous, tmpfs and page-cache pages alike), which the polling watchdog in
verifier_pool.process only approximates.

Where: a child of the worker's own cgroup, on cgroup v2 when that cgroup hands the memory controller to
its children (`memory` in cgroup.subtree_control: a delegated subtree, e.g. systemd's Delegate=yes) and on
a v1 memory hierarchy the worker may write (root in a container with the v1 hierarchy mounted read-write).
Neither: None, and the watchdog alone caps the tree. How a process gets in: the first program of the
sandbox's chain writes its own pid to cgroup.procs before it execs anything (`ENTER`), so every later
fork is born inside; nothing runs outside it, unlike moving a pid after spawn, which races with the forks.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

# $1 is the cgroup.procs file; runs first in the chain, as the worker's uid.
ENTER = r"""
echo $$ > "$1"
shift
exec "$@"
"""


@dataclass(frozen=True, slots=True)
class MemoryCgroup:
    path: str
    version: int  # 1 or 2

    @property
    def procs_file(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def oom_kills(self) -> int:
        """How many processes the kernel killed here for the cap (since the cgroup was made)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError), open(os.path.join(self.path, name)) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove(self) -> None:
        """rmdir, once its processes are gone (the caller waited for the tree); a leftover is harmless."""
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


def parent_dir() -> tuple[int, str] | None:
    """(version, the directory under which this worker may make memory cgroups), or None."""
    mounts = _cgroup_mounts()
    own = _own_cgroups()
    if "" in own and 2 in mounts:  # cgroup v2: "0::/path"
        path = mounts[2] + own[""]
        if "memory" in _read(os.path.join(path, "cgroup.subtree_control")).split() and os.access(path, os.W_OK):
            return 2, path
    if "memory" in own and "memory" in mounts:
        path = mounts["memory"] + own["memory"]
        if os.path.exists(os.path.join(path, "memory.limit_in_bytes")) and os.access(path, os.W_OK):
            return 1, path
    return None


def create(name: str, limit_bytes: int) -> MemoryCgroup | None:
    """A fresh cgroup `name` capped at `limit_bytes` (swap included where the host accounts it), or None
    where no memory cgroup can be made here."""
    found = parent_dir()
    if found is None:
        return None
    version, parent = found
    _remove_orphans(parent)
    cgroup = MemoryCgroup(os.path.join(parent, name), version)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(cgroup.path)  # a previous one of the same name, if empty: fresh counters
    os.mkdir(cgroup.path)
    try:
        if version == 2:
            _write(cgroup.path, "memory.max", limit_bytes)
            _write(cgroup.path, "memory.swap.max", 0, optional=True)
            _write(cgroup.path, "memory.oom.group", 1, optional=True)  # the whole tree dies, as a crash
        else:
            _write(cgroup.path, "memory.limit_in_bytes", limit_bytes)
            _write(cgroup.path, "memory.memsw.limit_in_bytes", limit_bytes, optional=True)  # after the above
    except OSError:
        cgroup.remove()
        raise
    return cgroup


def _remove_orphans(parent: str) -> None:
    """The empty cgroups of workers that died without removing theirs (named proofstream-<pid>-...)."""
    for entry in os.listdir(parent):
        prefix, _, rest = entry.partition("-")
        pid = rest.partition("-")[0]
        if prefix == "proofstream" and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(parent, entry))


def _write(path: str, name: str, value: int, optional: bool = False) -> None:
    try:
        with open(os.path.join(path, name), "w") as f:
            f.write(str(value))
    except FileNotFoundError:
        if not optional:
            raise


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cgroup_mounts() -> dict[int | str, str]:
    """{2: the cgroup2 mount point, "memory": the v1 memory hierarchy's}, from /proc/self/mountinfo."""
    mounts: dict[int | str, str] = {}
    for line in _read("/proc/self/mountinfo").splitlines():
        fields = line.split()
        sep = fields.index("-")
        fstype, options = fields[sep + 1], fields[sep + 3].split(",") if len(fields) > sep + 3 else []
        if fstype == "cgroup2":
            mounts.setdefault(2, fields[4])
        elif fstype == "cgroup" and "memory" in options and fields[3] == "/":
            mounts.setdefault("memory", fields[4])
    return mounts


def _own_cgroups() -> dict[str, str]:
    """{controller list ("" for v2): this process's path}, from /proc/self/cgroup."""
    own = {}
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own
