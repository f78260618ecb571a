"""A sandbox's process tree as /proc shows it: who is in it, whether it is gone, how much memory it holds.

Two walks, for two needs. `process_tree` scans every /proc entry: complete (a process re-parented inside
the pid namespace is still found under its init), used when killing, where completeness is what matters.
`tree_pids` follows /proc/<pid>/task/<tid>/children: it costs per process of the tree, not per process of
the host, and is what the memory watchdog polls during every request; a process forked between two reads
may be missed once, and is counted at the next poll.
"""

from __future__ import annotations

import asyncio
import os
import time

from verifier_pool.sandbox import SandboxUnavailable


def read_stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) from /proc/<pid>/stat, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may contain spaces and parentheses
    return int(fields[1]), fields[0].decode(), int(fields[19])


def process_tree(root: int) -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time)} of `root` and all its descendants. Orphans inside the pid namespace
    are re-parented to its init, itself a descendant, so nothing in the namespace escapes this walk."""
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := read_stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
            stats[int(entry)] = (stat[0], stat[2])
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats and pid not in tree:
            tree[pid] = stats[pid]
            todo += children.get(pid, [])
    return tree


def tree_pids(root: int) -> list[int]:
    """`root` and its descendants through the kernel's children lists (CONFIG_PROC_CHILDREN); falls back to
    the full scan where those files do not exist."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # exited meanwhile
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    todo += [int(child) for child in f.read().split()]
            except FileNotFoundError:
                if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                    continue  # the thread exited
                return list(process_tree(root))  # a kernel without children lists
            except OSError:
                continue
    return pids


def alive(pid: int, start_time: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and stat[2] == start_time and stat[1] != "Z"  # same process, not yet a zombie


async def wait_gone(tree: dict[int, tuple[int, int]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(alive(pid, start) for pid, (_, start) in tree.items()):
        if time.monotonic() > deadline:
            left = [pid for pid, (_, start) in tree.items() if alive(pid, start)]
            # The infrastructure's fault (a process stuck in the kernel), not the proof's.
            raise SandboxUnavailable(f"processes {left} survived SIGKILL for {timeout_s} s")
        await asyncio.sleep(0.01)


def resident_bytes(pids: list[int]) -> int:
    """The sum of VmRSS over `pids`: anonymous, file-backed and shared memory (RssShmem: SysV or tmpfs pages
    a process maps) that is resident. Pages shared between processes of the tree (after fork) count once
    per process: an overestimate, which a cap may afford, where PSS (smaps_rollup) would walk page tables
    on every poll."""
    total_kib = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                total_kib += next((int(line.split()[1]) for line in f if line.startswith(b"VmRSS:")), 0)
        except OSError:
            continue  # exited while we were summing
    return total_kib * 1024


_CHARGED = (b"Pss_Anon:", b"Pss_Shmem:", b"SwapPss:")


def charged_bytes(pids: list[int]) -> int:
    """The memory the tree holds that the kernel cannot drop, as a cgroup would count it for a cap:
    anonymous and shared (SysV, tmpfs-mapped) pages, resident or swapped, each shared page split among the
    processes that map it (PSS), so forked children sharing their parent's pages are not counted k times.
    File-backed pages (the binary, a REPL's mmapped .olean files) are left out: the kernel reclaims them
    under pressure. Processes we may not read (another uid's, not dumpable) count 0: they are the sandbox
    tools (bwrap), not the checker."""
    total_kib = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            continue  # exited meanwhile, or not ours to read
        fields = {parts[0]: parts[1] for parts in map(bytes.split, lines[1:]) if len(parts) >= 2}  # "Key: n kB"
        if b"Pss_Anon:" not in fields:  # before Linux 5.8: all of PSS, file pages included
            total_kib += int(fields.get(b"Pss:", 0))
            continue
        total_kib += sum(int(fields.get(key, 0)) for key in _CHARGED)
    return total_kib * 1024


def tmpfs_used_bytes(pid: int, path: str) -> int:
    """Bytes used on the filesystem at `path` as process `pid` sees it (its mount namespace, through
    /proc/<pid>/root): a sandbox's private /tmp is memory. 0 when it cannot be read (the process is gone, or
    we may not look into it)."""
    try:
        st = os.statvfs(f"/proc/{pid}/root{path}")
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize
