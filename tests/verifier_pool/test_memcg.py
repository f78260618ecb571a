"""Reading a memory cgroup's usage (verifier_pool.memcg), on directories laid out as the kernel lays out a v1
and a v2 memory cgroup: no cgroup needed. A real container's cgroup is read by the docker sandbox's recycle
tests (tests/verifier_pool/test_sandbox_probes.py)."""

from __future__ import annotations

import os

import pytest

from verifier_pool import memcg

MIB = 1 << 20


def _cgroup(path, **files: str):
    path.mkdir()
    for name, text in files.items():
        (path / name.replace("_", ".", 1)).write_text(text)
    return str(path)


def test_v2_usage_is_memory_current_less_inactive_file(tmp_path):
    directory = _cgroup(
        tmp_path / "v2",
        memory_current="104857600\n",
        memory_stat="anon 94371840\nfile 10485760\nactive_file 6291456\ninactive_file 4194304\n",
    )
    assert memcg.usage_bytes(directory) == 100 * MIB - 4 * MIB


def test_v1_usage_takes_the_hierarchical_inactive_file(tmp_path):
    """v1's memory.stat has both: `inactive_file` of the cgroup itself, `total_inactive_file` with its
    children, as its usage_in_bytes counts them."""
    directory = _cgroup(
        tmp_path / "v1",
        memory_usage_in_bytes="52428800\n",
        memory_stat="cache 8388608\ninactive_file 1048576\ntotal_cache 8388608\ntotal_inactive_file 3145728\n",
    )
    assert memcg.usage_bytes(directory) == 50 * MIB - 3 * MIB


def test_an_unreadable_cgroup_reads_none(tmp_path):
    assert memcg.usage_bytes(str(tmp_path / "absent")) is None
    no_stat = _cgroup(tmp_path / "no-stat", memory_current="4096\n")
    assert memcg.usage_bytes(no_stat) is None
    garbage = _cgroup(tmp_path / "garbage", memory_current="max\n", memory_stat="inactive_file 0\n")
    assert memcg.usage_bytes(garbage) is None


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
