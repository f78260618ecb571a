"""Reading a memory cgroup's usage (verifier_pool.memcg), on directories laid out as the kernel lays out a v1
and a v2 memory cgroup: no cgroup needed. A real container's cgroup is read by the docker sandbox's recycle
tests (tests/verifier_pool/test_sandbox_probes.py)."""

from __future__ import annotations

import os

import pytest

from verifier_pool import memcg

MIB = 1 << 20


V2_STAT = "anon 94371840\nfile 10485760\nactive_file 6291456\ninactive_file 4194304\n"
# v1's memory.stat has both: `inactive_file` of the cgroup itself, `total_inactive_file` with its children, as
# its usage_in_bytes counts them.
V1_STAT = "cache 8388608\ninactive_file 1048576\ntotal_cache 8388608\ntotal_inactive_file 3145728\n"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"memory.current": "104857600\n", "memory.stat": V2_STAT}, 100 * MIB - 4 * MIB),
        ({"memory.usage_in_bytes": "52428800\n", "memory.stat": V1_STAT}, 50 * MIB - 3 * MIB),
        (None, None),  # no such directory
        ({"memory.current": "4096\n"}, None),  # no memory.stat
        ({"memory.current": "max\n", "memory.stat": "inactive_file 0\n"}, None),  # not a number
    ],
    ids=["v2", "v1", "absent", "no-stat", "garbage"],
)
def test_usage_is_the_cgroups_usage_less_its_inactive_file_cache(tmp_path, files, expected):
    directory = tmp_path / "cgroup"
    if files is not None:
        directory.mkdir()
        for name, text in files.items():
            (directory / name).write_text(text)
    assert memcg.usage_bytes(str(directory)) == expected


def test_the_daemons_figures_are_charged_alike():
    """docker stats' JSON carries memory.stat's keys: the same rule applies, never below zero."""
    assert memcg.charged(10 * MIB, {"inactive_file": 2 * MIB}) == 8 * MIB
    assert memcg.charged(10 * MIB, {"total_inactive_file": 3 * MIB, "inactive_file": 1 * MIB}) == 7 * MIB
    assert memcg.charged(MIB, {"inactive_file": 2 * MIB}) == 0
    assert memcg.charged(MIB, {}) == MIB


def test_this_process_is_listed_in_the_memory_cgroups_found_for_it():
    """The kernel's own word: a cgroup's cgroup.procs lists the processes in it."""
    dirs = memcg.memory_dirs(os.getpid())
    if not dirs:
        pytest.skip("no cgroup hierarchy is mounted here")
    assert memcg.memory_dirs() == dirs  # "self"
    for directory in dirs.values():
        with open(os.path.join(directory, "cgroup.procs")) as f:
            assert str(os.getpid()) in f.read().split(), directory
    assert memcg.memory_dirs(2**22 + 1) == {}  # above the largest pid_max: no such process
