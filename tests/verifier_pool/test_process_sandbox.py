"""The `process` sandbox, for real: bubblewrap and unshare (each where it works here), real subprocesses and
the fake REPL (tests/fixtures/fake_repl.py, a test double driven by FIXTURE: markers). The assertions are
about our sandbox, never about Lean."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from verifier_pool import process
from verifier_pool.process import ProcessSandbox, ProcessSandboxConfig
from verifier_pool.repl import ReplStream
from verifier_pool.sandbox import SandboxCrashed, SandboxTimeout, SandboxUnavailable

pytestmark = pytest.mark.timeout(30)

FIXTURES = Path(__file__).parents[1] / "fixtures"
FAKE_REPL = FIXTURES / "fake_repl.py"
PYTHON = os.path.realpath(sys.executable)  # the interpreter itself: the venv's symlinks are not bound


def _isolations() -> list:
    working = [tool for tool in process.ISOLATION_TOOLS if process._probe(tool) is None]
    if not working:
        reasons = "; ".join(f"{tool}: {process._probe(tool)}" for tool in process.ISOLATION_TOOLS)
        print(f"process sandbox tests skipped: neither bwrap nor unshare works here ({reasons})")
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no isolation tool works: {reasons}"))]
    params = []
    for tool in working:
        if tool == "unshare" and str(FIXTURES.resolve()).startswith("/tmp/"):
            # The unshare sandbox mounts a private /tmp over the host's, so it cannot run a checker that lives
            # under /tmp (it refuses such paths with SandboxUnavailable); a checkout under /tmp cannot test it.
            reason = f"unshare hides /tmp and this checkout is at {FIXTURES.parents[1]}"
            print(f"process sandbox tests: unshare variant skipped: {reason}")
            params.append(pytest.param(tool, marks=pytest.mark.skip(reason=reason)))
        else:
            params.append(tool)
    return params


def _config(isolation: str, **overrides) -> ProcessSandboxConfig:
    fields = {
        "argv": (PYTHON, "-I", str(FAKE_REPL)),
        "ro_paths": (sys.base_prefix, str(FIXTURES)),
        "memory_limit_bytes": 512 << 20,
        "isolation": isolation,
    }
    return ProcessSandboxConfig(**(fields | overrides))


@pytest.fixture(params=_isolations())
def isolation(request) -> str:
    return request.param


@pytest.fixture
async def make_sandbox(isolation):
    """Factory of started sandboxes on the parametrized isolation tool, all killed at teardown."""
    sandboxes = []

    async def make(**overrides) -> ProcessSandbox:
        sandbox = ProcessSandbox(_config(isolation, **overrides))
        sandboxes.append(sandbox)
        await sandbox.start()
        return sandbox

    yield make
    for sandbox in sandboxes:
        await sandbox.kill()


@pytest.fixture
async def sandbox(make_sandbox) -> ProcessSandbox:
    return await make_sandbox()


def _tree(root: int) -> set[int]:
    """pids of `root` and its descendants, from /proc."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue  # exited meanwhile
        parents[int(entry)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
    tree, grew = {root}, True
    while grew:
        new = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= new
        grew = bool(new)
    return tree & (set(parents) | {root})


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _probe_result(response: dict) -> str:
    return response["messages"][0]["data"]


async def test_round_trip_and_env_counter(sandbox):
    assert await sandbox.request({"cmd": "import Mathlib"}, 5) == {"env": 0}
    sorry = await sandbox.request({"cmd": "FIXTURE:sorry", "env": 0}, 5)
    assert sorry["env"] == 1 and sorry["sorries"][0]["proofState"] == 0
    assert await sandbox.request({"cmd": "x", "env": 5}, 5) == {"message": "Unknown environment."}
    stats = sandbox.stats()
    assert (stats.starts, stats.requests, stats.backend) == (1, 3, "process")


async def test_hang_is_killed_within_the_deadline_and_nothing_survives(sandbox):
    forked = await sandbox.request({"cmd": "FIXTURE:forkbomb=5"}, 5)  # children that would outlive a lazy kill
    assert _probe_result(forked) == "forks: 5"
    pgid = sandbox.pid
    tree = _tree(pgid)
    assert len(tree) >= 7  # the isolation tool, the fake and its 5 children
    started = time.monotonic()
    with pytest.raises(SandboxTimeout):
        await sandbox.request({"cmd": "FIXTURE:hang"}, 0.5)
    # the timeout, then kill, reap and start the replacement (a Python start: over 1 s at load 6 on 2 cores)
    assert time.monotonic() - started < 0.5 + 2.5
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert [pid for pid in tree if _running(pid)] == []
    stats = sandbox.stats()
    assert (stats.timeouts, stats.starts) == (1, 2)  # already replaced: the next request waits for no start
    assert sandbox.pid != pgid
    assert await sandbox.request({"cmd": "x"}, 5) == {"env": 0}


async def test_crash_reports_stderr_and_the_next_request_gets_a_fresh_sandbox(sandbox):
    await sandbox.request({"cmd": "x"}, 5)
    with pytest.raises(SandboxCrashed, match="Stack overflow detected") as caught:
        await sandbox.request({"cmd": "FIXTURE:crash"}, 5)
    assert "exit status 134" in str(caught.value)
    assert sandbox.stats().starts == 2  # replaced before the next request: env ids cached by callers expire now
    assert await sandbox.request({"cmd": "x"}, 5) == {"env": 0}
    stats = sandbox.stats()
    assert (stats.crashes, stats.starts, stats.total_requests) == (1, 2, 2)


async def test_a_refused_payload_costs_no_restart(sandbox):
    with pytest.raises(ValueError):
        await sandbox.request({"cmd": "\ud835"}, 5)  # a lone surrogate cannot be sent as UTF-8
    assert await sandbox.request({"cmd": "x"}, 5) == {"env": 0}
    assert sandbox.stats().starts == 1


async def test_garbage_is_a_crash(sandbox):
    with pytest.raises(SandboxCrashed, match="unparsable"):
        await sandbox.request({"cmd": "FIXTURE:garbage"}, 5)


async def test_ten_megabytes_of_output_fail_fast(sandbox):
    started = time.monotonic()
    with pytest.raises(SandboxCrashed, match="exceeds"):
        await sandbox.request({"cmd": "FIXTURE:bigout"}, 10)
    assert time.monotonic() - started < 3


async def test_memory_bomb_hits_rlimit_as_not_the_machine(sandbox):
    with pytest.raises(SandboxCrashed, match="bad_alloc"):
        await sandbox.request({"cmd": "FIXTURE:membomb"}, 10)
    assert await sandbox.request({"cmd": "x"}, 5) == {"env": 0}


async def test_stderr_is_drained(sandbox):
    # 1 MB on stderr blocks a checker whose stderr pipe (64 KiB) nobody reads.
    assert await sandbox.request({"cmd": "FIXTURE:stderr=1000000"}, 5) == {"env": 0}
    assert sandbox.stderr_tail == "e" * 4096


async def test_recycled_after_max_requests(make_sandbox):
    sandbox = await make_sandbox(max_requests=3)
    envs, starts = [], []
    for _ in range(5):
        envs.append((await sandbox.request({"cmd": "x"}, 5))["env"])
        starts.append(sandbox.stats().starts)
    assert envs == [0, 1, 2, 0, 1]
    assert starts == [1, 1, 2, 2, 2]


async def test_recycled_past_the_memory_threshold(make_sandbox):
    sandbox = await make_sandbox(max_memory_bytes=150 << 20)
    assert await sandbox.request({"cmd": "FIXTURE:grow=50"}, 10) == {"env": 0}
    assert await sandbox.request({"cmd": "x"}, 5) == {"env": 1}
    assert sandbox.stats().starts == 1
    assert await sandbox.request({"cmd": "FIXTURE:grow=150"}, 10) == {"env": 2}
    assert sandbox.stats().memory_bytes > 150 << 20
    assert sandbox.stats().starts == 2
    assert await sandbox.request({"cmd": "x"}, 5) == {"env": 0}


async def test_no_network(sandbox):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        # The same probe outside any sandbox reaches the port, so a failure inside is the sandbox's doing.
        outside = await asyncio.create_subprocess_exec(
            PYTHON, "-I", str(FAKE_REPL), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        unsandboxed = await ReplStream(outside.stdout, outside.stdin).exchange({"cmd": f"FIXTURE:net={port}"}, 10)
        outside.stdin.close()
        await outside.wait()
        response = await sandbox.request({"cmd": f"FIXTURE:net={port}"}, 10)
    assert _probe_result(unsandboxed) == "probe net: ok"
    assert _probe_result(response).startswith("probe net: failed")


async def test_filesystem_is_read_only_except_a_private_tmp(make_sandbox, tmp_path):
    first, second = await make_sandbox(), await make_sandbox()
    for path in ("/usr/x", str(FIXTURES / "x"), "/x"):
        assert _probe_result(await first.request({"cmd": f"FIXTURE:write={path}"}, 5)).startswith(
            "probe write: failed"
        ), path
    assert _probe_result(await first.request({"cmd": "FIXTURE:write=/tmp/mine"}, 5)) == "probe write: ok"
    # Another sandbox's /tmp (another attempt's files) and the host's /tmp are out of sight.
    assert _probe_result(await second.request({"cmd": "FIXTURE:read=/tmp/mine"}, 5)).startswith("probe read: failed")
    (tmp_path / "host-secret").write_text("x")
    host_file = tmp_path / "host-secret"
    assert _probe_result(await second.request({"cmd": f"FIXTURE:read={host_file}"}, 5)).startswith("probe read: failed")


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK), reason="needs root and /usr/bin/python3"
)
async def test_non_root_uid_binds_nproc_and_file_permissions(make_sandbox):
    # The venv's interpreter lives under /root (unreadable to uid 65534): use the system one.
    sandbox = await make_sandbox(
        argv=("/usr/bin/python3", "-I", str(FAKE_REPL)), ro_paths=(str(FIXTURES),), uid=65534, nproc_limit=16
    )
    forks = _probe_result(await sandbox.request({"cmd": "FIXTURE:forkbomb=100"}, 10))
    assert int(forks.removeprefix("forks: ")) < 16
    shadow = _probe_result(await sandbox.request({"cmd": "FIXTURE:read=/etc/shadow"}, 5))
    assert shadow.startswith("probe read: failed")


def test_available_names_a_working_tool(isolation):
    assert process.available() in process.ISOLATION_TOOLS


async def test_unstartable_sandboxes_are_unavailable_not_crashes(isolation):
    for overrides in ({"argv": ("/nonexistent/checker",)}, {"ro_paths": ("/nonexistent",)}):
        sandbox = ProcessSandbox(_config(isolation, **overrides))
        with pytest.raises(SandboxUnavailable):
            await sandbox.start()
        assert sandbox.pid is None


@pytest.mark.skipif(process._probe("bwrap") is not None, reason="bwrap does not work here")
def test_bwrap_argv_binds_read_only_and_ends_with_the_checker():
    config = _config("bwrap", workdir=str(FIXTURES))
    argv = process.bwrap_argv("bwrap", config, status_fd=9)
    for flag in ("--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert ("--disable-userns" in argv) == process._bwrap_supports("bwrap", "--disable-userns")
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert ["--ro-bind", str(FIXTURES), str(FIXTURES)] == argv[argv.index(str(FIXTURES)) - 1 :][:3]
    assert "--bind" not in argv  # nothing writable is bound in; /tmp is a fresh tmpfs
    tail = argv[argv.index("--remount-ro") :]
    assert tail == [
        "--remount-ro",
        "/proc",
        "--remount-ro",
        "/",
        "--chdir",
        str(FIXTURES),
        "--",
        PYTHON,
        "-I",
        str(FAKE_REPL),
    ]


async def test_a_cancelled_request_leaves_no_stale_reply_behind(sandbox):
    slow = asyncio.create_task(sandbox.request({"cmd": "FIXTURE:slow=0.5"}, 5))
    await asyncio.sleep(0.2)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    # The late reply of the cancelled request must not be taken for this one's: a fresh checker answers.
    assert await sandbox.request({"cmd": "x"}, 5) == {"env": 0}
    assert sandbox.stats().starts == 2
