"""A memory cgroup per process sandbox, where the host lets the worker make one: the kernel's own cap on
the whole tree (anonymous, tmpfs and page-cache pages alike), which the polling watchdog in
verifier_pool.process only approximates.

Where: a child of the worker's own cgroup, on cgroup v2 when that cgroup hands the memory controller to
its children (`memory` in cgroup.subtree_control: a delegated subtree, e.g. systemd's Delegate=yes) and on
a v1 memory hierarchy the worker may write (root in a container with the v1 hierarchy mounted read-write).
Neither: None, and the watchdog alone caps the tree. How a process gets in: the first program of the
sandbox's chain writes its own pid to cgroup.procs before it execs anything (`ENTER`), so every later
fork is born inside; nothing runs outside it, unlike moving a pid after spawn, which races with the forks.

Reading: `usage_bytes` is a memory cgroup's usage as `docker stats` counts it (`charged`: usage less the
inactive file cache, which the kernel reclaims first), what the docker backend compares with its recycle
threshold (`memory_dir_of` finds a container's cgroup from its main pid). Which cgroup a process is in and
where the hierarchies are mounted is read once here (`cgroup_paths`, `memory_dirs`), for both uses.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
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
    dirs = memory_dirs()
    path = dirs.get(2)
    if path and "memory" in _read(os.path.join(path, "cgroup.subtree_control")).split() and os.access(path, os.W_OK):
        return 2, path
    path = dirs.get(1)
    if path and os.path.exists(os.path.join(path, "memory.limit_in_bytes")) and os.access(path, os.W_OK):
        return 1, path
    return None


def memory_dirs(pid: int | str = "self") -> dict[int, str]:
    """{cgroup version: the directory of process `pid`'s memory cgroup as this machine mounts it}: 2 where a
    cgroup2 hierarchy is mounted, 1 where a v1 memory hierarchy is (a hybrid host has both; one of them
    holds the memory controller). {} where /proc/<pid> cannot be read."""
    mounts, own = _cgroup_mounts(), cgroup_paths(pid)
    dirs = {}
    if "" in own and 2 in mounts:  # cgroup v2: "0::/path"
        dirs[2] = mounts[2] + own[""]
    if "memory" in own and "memory" in mounts:
        dirs[1] = mounts["memory"] + own["memory"]
    return dirs


def memory_dir_of(pid: int, name: str) -> str | None:
    """The memory cgroup directory of process `pid` whose path holds `name` (a container's id: the check that
    guards against a pid reused by another process) and whose usage can be read; None where none can."""
    for directory in memory_dirs(pid).values():
        if name in directory and usage_bytes(directory) is not None:
            return directory
    return None


def usage_bytes(directory: str) -> int | None:
    """The memory cgroup's usage (`charged`), cgroup v1 or v2; None where its files cannot be read."""
    try:
        for name in ("memory.usage_in_bytes", "memory.current"):  # cgroup v1, v2
            with contextlib.suppress(FileNotFoundError), open(os.path.join(directory, name)) as f:
                usage = int(f.read())
                break
        else:
            return None
        with open(os.path.join(directory, "memory.stat")) as f:
            stat = dict(line.split() for line in f if line.strip())
    except (OSError, ValueError):
        return None
    return charged(usage, stat)


def charged(usage: int, stat: Mapping[str, int | str]) -> int:
    """A cgroup's memory as `docker stats` counts it: `usage` less the inactive file cache of its memory.stat
    (`total_inactive_file` on cgroup v1, `inactive_file` on v2), which the kernel reclaims first."""
    return max(0, usage - int(stat.get("total_inactive_file", stat.get("inactive_file", 0))))


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


def cgroup_paths(pid: int | str = "self") -> dict[str, str]:
    """{controller ("" for cgroup v2): process `pid`'s cgroup path}, from /proc/<pid>/cgroup."""
    own = {}
    for line in _read(f"/proc/{pid}/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own
