"""The probe suite: for each thing a sandbox must block, a program inside the sandbox tries it and the test
asserts it failed; each poison program ends within twice its deadline with the worker (this process) alive
and a neighbour sandbox unaffected. Parametrized over every backend that works here: the process sandbox
under bwrap and under unshare, and docker where a daemon and the checker image are present. The program
inside is the fake REPL (ops/bench/synthetic_repl.py: its FIXTURE: probes). The last section holds what
every backend's request path must do alike.

Where a probe has a control (a socket the host can reach, a file the host can read), the control is checked
from this process first, so a failure inside is the sandbox's doing and not a missing file.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.verifier_pool.sandboxes import PROCESS_ROOT, REPL_DIR, Started, backends
from verifier_pool.sandbox import SandboxCrashed, SandboxTimeout

pytestmark = pytest.mark.timeout(90)

CHECKOUT = Path(__file__).resolve().parents[2]

TMP_BYTES = 64 << 20
PROCESS_CAP = 64
DEADLINE_S = 3.0
# /dev's usual character devices, mount points and links
USUAL_DEVICES = {"null", "zero", "full", "random", "urandom", "tty", "console", "ptmx"} | {"pts", "shm", "mqueue"}
USUAL_DEVICES |= {"fd", "stdin", "stdout", "stderr", "core"}


@pytest.fixture(params=backends())
def backend(request) -> str:
    return request.param


@pytest.fixture
async def make_sandbox(backend):
    """Factory of started sandboxes on the parametrized backend (a 512 MiB memory cap, a TMP_BYTES /tmp,
    PROCESS_CAP processes), all killed at teardown."""
    async with Started(backend, tmp_bytes=TMP_BYTES, pids_limit=PROCESS_CAP) as started:
        yield started


async def _probe(sandbox, marker: str) -> str:
    return await _probe_with(sandbox, marker, 10)


async def _probe_with(sandbox, marker: str, timeout_s: float) -> str:
    response = await sandbox.request({"cmd": f"FIXTURE:{marker}"}, timeout_s)
    return response["messages"][0]["data"].split(": ", 1)[1]


async def _listdir(sandbox, path: str) -> list[str]:
    listing = await _probe(sandbox, f"listdir={path}")
    assert listing.startswith("ok: "), (path, listing)
    return json.loads(listing.removeprefix("ok: "))


# -- what the sandbox must block --------------------------------------------------------------------------


async def test_no_host_unix_socket_answers(make_sandbox, tmp_path):
    sandbox = await make_sandbox()
    sockets = [p for p in ("/var/run/docker.sock", "/run/containerd/containerd.sock") if os.path.exists(p)]
    for path in sockets:
        assert (await _probe(sandbox, f"unix={path}")).startswith("failed"), path
    # Abstract sockets have no file to hide: only a network namespace of its own keeps them out of reach.
    name = f"proofstream-probe-{uuid.uuid4().hex[:8]}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("\0" + name)
        server.listen()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as control:
            control.connect("\0" + name)  # the host reaches it
        assert (await _probe(sandbox, f"abstract={name}")).startswith("failed")


async def test_no_process_outside_the_sandbox_can_be_traced(make_sandbox):
    """The 2025 exploit against Lean verifiers that compiles C with the toolchain's compiler and patches the
    checker's memory with ptrace: code run from a proof can do anything its REPL process can (the Lean image
    ships a C compiler), so what matters is what it reaches. Not the worker that judges (this process), nor
    another sandbox (the audit runs in one of its own, started for it): PTRACE_ATTACH to either fails, while the
    host sees both. Tracing its own child is the control (it fails too where ptrace is blocked altogether)."""
    sandbox, neighbour = await make_sandbox(), await make_sandbox()
    control = await _probe(sandbox, "ptrace=child")
    targets = [os.getpid(), *([neighbour.pid] if getattr(neighbour, "pid", None) else [])]
    for pid in targets:
        assert Path(f"/proc/{pid}").exists(), pid  # the host sees it
        assert (await _probe(sandbox, f"ptrace={pid}")).startswith("failed"), (pid, control)


@pytest.fixture
def host_secrets():
    """Files the host can read in places a sandbox must not show: /root, /home, /run, the checkout's .git."""
    tag = f".proofstream-probe-{uuid.uuid4().hex[:8]}"
    made = []
    for parent in ("/root", "/home", "/run", "/var/run"):
        if os.path.isdir(parent) and os.access(parent, os.W_OK):
            path = Path(parent) / tag
            if not path.exists():
                path.write_text("secret")
                made.append(path)
    git_head = CHECKOUT / ".git" / "HEAD"
    yield [*made, *([git_head] if git_head.exists() else [])]
    for path in made:
        path.unlink(missing_ok=True)


async def test_a_private_root_shows_only_what_the_checker_needs(backend, make_sandbox, host_secrets):
    sandbox = await make_sandbox()
    assert host_secrets, "no host file to probe with"
    for path in host_secrets:
        assert path.read_text()  # the control: the host reads it
        assert (await _probe(sandbox, f"read={path}")).startswith("failed"), path
    assert (await _probe(sandbox, f"listdir={CHECKOUT / '.git'}")).startswith("failed")
    if backend != "docker":  # a container's root is its image's, with its own /run, /root and /home
        for path in ("/run", "/var/run", "/home"):
            assert (await _probe(sandbox, f"listdir={path}")).startswith("failed"), path
        top = set(await _listdir(sandbox, "/"))
        bound_tops = {Path(p).parts[1] for p in (sys.base_prefix, str(REPL_DIR))}
        assert top <= PROCESS_ROOT | bound_tops, top - PROCESS_ROOT - bound_tops
        # The skeleton down to a bind under /root holds that bind's path, none of /root's own files.
        for parent in ("/root", "/home"):
            if parent.lstrip("/") in top:
                bound = (sys.base_prefix, str(REPL_DIR))
                expected = {Path(p).parts[2] for p in bound if Path(p).parts[1] == parent[1:]}
                assert set(await _listdir(sandbox, parent)) == expected


async def test_dev_is_read_only_with_the_usual_devices_and_no_unbounded_shm(make_sandbox):
    sandbox = await make_sandbox()
    assert set(await _listdir(sandbox, "/dev")) <= USUAL_DEVICES
    assert (await _probe(sandbox, "write=/dev/probe")).startswith("failed")
    # /dev/shm is absent or read-only (process sandbox) or a capped tmpfs counted in the cgroup (docker):
    # either way 100 MiB do not fit where a checker once parked 320 MiB.
    assert (await _probe(sandbox, "fill=/dev/shm/probe,100")).startswith("failed")
    assert await _probe(sandbox, "write=/dev/null") == "ok"  # the devices themselves work


async def test_tmp_is_capped(make_sandbox):
    sandbox = await make_sandbox()
    assert (await _probe(sandbox, f"fill=/tmp/probe,{(TMP_BYTES >> 20) + 8}")).startswith("failed")


async def _split_bomb_is_contained(sandbox, timeout_s: float) -> None:
    """Four processes of 200 MiB each, over the cap together: the process sandbox's watchdog ends the check
    (a crash, "memory cap"); a memory cgroup (docker's, or the process sandbox's where the host has one)
    may instead OOM-kill a child, so that fewer than four ever hold their memory at once."""
    cgroup = sandbox.backend == "docker" or sandbox.stats().extra.get("memory_cgroup") is not None
    try:
        held = await _probe_with(sandbox, "split=4,200", timeout_s)
    except SandboxCrashed as e:
        assert sandbox.backend == "docker" or "memory cap" in str(e)
        return
    assert cgroup and int(held) < 4


async def test_one_memory_cap_for_the_whole_tree(make_sandbox):
    """Every process is under any per-process limit; together they pass the cap."""
    sandbox, neighbour = await make_sandbox(), await make_sandbox()
    started = time.monotonic()
    await _split_bomb_is_contained(sandbox, DEADLINE_S)
    assert time.monotonic() - started < 2 * DEADLINE_S
    assert (await sandbox.request({"cmd": "x"}, 10))["env"] in (0, 1)
    assert await neighbour.request({"cmd": "x"}, 10) == {"env": 0}
    assert neighbour.stats().starts == 1
    # Under the cap, the same program is fine: the cap is the tree's sum, not a lower per-process limit.
    # Asked of the neighbour: where a memory cgroup killed only some of the bomb's children, the others
    # still sleep in `sandbox`, holding their memory (2 x 150 MiB on top of them can get one killed).
    assert await _probe(neighbour, "split=2,150") == "2"


async def test_a_fork_bomb_stops_at_the_process_cap_and_a_neighbour_restarts(make_sandbox):
    bomber, neighbour = await make_sandbox(), await make_sandbox()
    forks = int((await bomber.request({"cmd": "FIXTURE:forkbomb=256"}, 30))["messages"][0]["data"].split()[-1])
    assert forks < PROCESS_CAP
    # While the bomb's processes hold their quota, the neighbour restarts as fast as ever.
    started = time.monotonic()
    await neighbour.start()
    assert time.monotonic() - started < DEADLINE_S
    assert await neighbour.request({"cmd": "x"}, 10) == {"env": 0}


# -- poison programs end within twice the deadline; the worker and the neighbours live on -----------------

POISON = {
    "hang": SandboxTimeout,
    "bigout": SandboxCrashed,
    "garbage": SandboxCrashed,
    "crash": SandboxCrashed,
}


@pytest.mark.parametrize("poison", [*POISON, "split=4,200", "forkbomb=256"])
async def test_poison_ends_within_twice_the_deadline(make_sandbox, poison):
    sandbox, neighbour = await make_sandbox(), await make_sandbox()
    assert await neighbour.request({"cmd": "x"}, 10) == {"env": 0}
    started = time.monotonic()
    if poison in POISON:
        with pytest.raises(POISON[poison]):
            await sandbox.request({"cmd": f"FIXTURE:{poison}"}, DEADLINE_S)
    elif poison.startswith("split"):
        await _split_bomb_is_contained(sandbox, DEADLINE_S)
    else:  # contained by the process cap: it answers
        await sandbox.request({"cmd": f"FIXTURE:{poison}"}, DEADLINE_S)
    assert time.monotonic() - started < 2 * DEADLINE_S
    assert (await sandbox.request({"cmd": "x"}, 10))["env"] in (0, 1)
    assert await neighbour.request({"cmd": "x"}, 10) == {"env": 1}  # the same checker, untouched
    assert neighbour.stats().starts == 1


# -- the shared request path (verifier_pool.sandbox_base) -------------------------------------------------


async def test_a_cancelled_request_leaves_no_stale_reply_behind(make_sandbox):
    sandbox = await make_sandbox()
    slow = asyncio.create_task(sandbox.request({"cmd": "FIXTURE:slow=0.5"}, 5))
    await asyncio.sleep(0.2)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    # The late reply of the cancelled request must not be taken for this one's: a fresh checker answers.
    assert await sandbox.request({"cmd": "x"}, 5) == {"env": 0}
    assert sandbox.stats().starts == 2


async def test_ten_megabytes_of_output_fail_fast(make_sandbox):
    sandbox = await make_sandbox()
    started = time.monotonic()
    with pytest.raises(SandboxCrashed, match="exceeds"):
        await sandbox.request({"cmd": "FIXTURE:bigout"}, 10)
    assert time.monotonic() - started < 3
    assert await sandbox.request({"cmd": "x"}, 10) == {"env": 0}  # a fresh checker: the stream was out of step
    assert sandbox.stats().starts == 2


async def test_recycled_past_the_memory_threshold(make_sandbox):
    sandbox = await make_sandbox(max_memory_bytes=150 << 20, memory_check_interval_s=0)  # read after every answer
    assert await sandbox.request({"cmd": "FIXTURE:grow=50"}, 10) == {"env": 0}
    assert await sandbox.request({"cmd": "x"}, 10) == {"env": 1}
    assert sandbox.stats().memory_bytes < 150 << 20
    assert await sandbox.request({"cmd": "FIXTURE:grow=150"}, 10) == {"env": 2}
    assert sandbox.stats().memory_bytes > 150 << 20
    assert await sandbox.request({"cmd": "x"}, 10) == {"env": 0}  # a fresh checker
    assert sandbox.stats().starts == 2


async def test_the_recycle_threshold_is_read_at_most_every_memory_check_interval_s(make_sandbox):
    """A reading after every answer (the cgroup's memory.stat, the tree's /proc) costs as much as a Countdown
    check: it is read once, then not again within `memory_check_interval_s`, however much the checker grew."""
    sandbox = await make_sandbox(max_memory_bytes=150 << 20, memory_check_interval_s=3600)
    assert await sandbox.request({"cmd": "x"}, 10) == {"env": 0}  # the first reading: small
    first = sandbox.stats().memory_bytes
    assert first < 150 << 20
    assert await sandbox.request({"cmd": "FIXTURE:grow=200"}, 10) == {"env": 1}
    assert await sandbox.request({"cmd": "x"}, 10) == {"env": 2}
    assert sandbox.stats().starts == 1  # over the threshold, but not read again yet
    assert sandbox.stats().memory_bytes == first
