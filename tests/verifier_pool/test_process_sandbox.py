"""The `process` sandbox, for real: bubblewrap and unshare (each where it works here), real subprocesses and
the fake REPL (ops/bench/synthetic_repl.py, a test double driven by FIXTURE: markers). The assertions are
about our sandbox, never about Lean. What every backend does alike is in test_sandbox_probes.py.

One file, over 450 lines, because these are the behaviours only this backend has: the launch chain, uids of
its own, the tree's memory cap and cgroup, and death with the worker however it dies, each asserted on /proc."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.verifier_pool.sandboxes import FAKE_REPL, FIXTURES, PROCESS_ROOT, PYTHON, REPL_DIR, Started, isolations
from tests.verifier_pool.sandboxes import config as _config
from verifier_pool import memcg, pool, process, process_argv, sandbox_uids
from verifier_pool.config import VerifierSettings
from verifier_pool.process import ProcessSandbox
from verifier_pool.repl import ReplStream
from verifier_pool.sandbox import SandboxCrashed, SandboxTimeout, SandboxUnavailable
from verifier_pool.sandbox_config import ISOLATION_TOOLS

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(params=isolations())
def isolation(request) -> str:
    return request.param


@pytest.fixture
async def make_sandbox(isolation):
    """Factory of started sandboxes on the parametrized isolation tool, all killed at teardown."""
    async with Started(isolation) as started:
        yield started


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


_PF_EXITING = 0x4  # the kernel's flag for a task in do_exit: killed, only its teardown left


def _running(pid: int) -> bool:
    """Alive and not on its way out: not a zombie, and not a killed process still tearing down (a pid
    namespace's init waits there for its children, in state D, for as long as they take to die)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in (b"Z", b"X") and not int(fields[6]) & _PF_EXITING


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
    for path in ("/usr/x", str(REPL_DIR / "x"), "/x"):
        assert _probe_result(await first.request({"cmd": f"FIXTURE:write={path}"}, 5)).startswith(
            "probe write: failed"
        ), path
    assert _probe_result(await first.request({"cmd": "FIXTURE:write=/tmp/mine"}, 5)) == "probe write: ok"
    # Another sandbox's /tmp (another attempt's files) and the host's /tmp are out of sight.
    assert _probe_result(await second.request({"cmd": "FIXTURE:read=/tmp/mine"}, 5)).startswith("probe read: failed")
    (tmp_path / "host-secret").write_text("x")
    host_file = tmp_path / "host-secret"
    assert _probe_result(await second.request({"cmd": f"FIXTURE:read={host_file}"}, 5)).startswith("probe read: failed")


async def test_a_bound_path_inside_the_workdir_is_bound_after_it(make_sandbox):
    """ro_paths name the fixtures before the workdir that holds them (the Lean and Countdown sandboxes bind a
    package inside the checkout they run in). Bound in that order the workdir's bind hid the fixtures' mount:
    unshare then could not remount it read-only and every start failed (bwrap hid it silently)."""
    workdir = str(REPL_DIR.parent)
    sandbox = await make_sandbox(workdir=workdir)
    assert await sandbox.request({"cmd": "import Mathlib"}, 5) == {"env": 0}
    for path in (str(REPL_DIR / "x"), str(REPL_DIR.parent / "x")):
        assert _probe_result(await sandbox.request({"cmd": f"FIXTURE:write={path}"}, 5)).startswith(
            "probe write: failed"
        ), path
    assert process_argv.private_root(_config("bwrap", workdir=workdir)).binds[-1] == (str(REPL_DIR), str(REPL_DIR))


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK), reason="needs root and /usr/bin/python3"
)
async def test_non_root_uid_binds_nproc_and_file_permissions(make_sandbox):
    # An explicit uid that nothing else runs as (65534 is Docker's sandboxes' uid: RLIMIT_NPROC counts
    # every process of a uid on the host).
    sandbox = await make_sandbox(
        argv=("/usr/bin/python3", "-I", str(FAKE_REPL)), ro_paths=(str(REPL_DIR),), uid=1_599_600, pids_limit=16
    )
    forks = _probe_result(await sandbox.request({"cmd": "FIXTURE:forkbomb=100"}, 10))
    assert int(forks.removeprefix("forks: ")) < 16
    shadow = _probe_result(await sandbox.request({"cmd": "FIXTURE:read=/etc/shadow"}, 5))
    assert shadow.startswith("probe read: failed")


def test_available_names_a_working_tool(isolation):
    assert process.available() in ISOLATION_TOOLS


async def test_unstartable_sandboxes_are_unavailable_not_crashes(isolation):
    for overrides in ({"argv": ("/nonexistent/checker",)}, {"ro_paths": ("/nonexistent",)}):
        sandbox = ProcessSandbox(_config(isolation, **overrides))
        with pytest.raises(SandboxUnavailable):
            await sandbox.start()
        assert sandbox.pid is None


@pytest.mark.skipif(process_argv.probe("bwrap") is not None, reason="bwrap does not work here")
def test_bwrap_argv_binds_read_only_and_ends_with_the_checker():
    config = _config("bwrap", workdir=str(REPL_DIR))
    argv = process_argv.bwrap_argv("bwrap", config, status_fd=9)
    for flag in ("--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert ("--disable-userns" in argv) == process_argv.bwrap_supports("bwrap", "--disable-userns")
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert ["--ro-bind", str(REPL_DIR), str(REPL_DIR)] == argv[argv.index(str(REPL_DIR)) - 1 :][:3]
    assert "--bind" not in argv  # nothing writable is bound in; /tmp is a fresh tmpfs
    tail = argv[argv.index("--remount-ro") :]
    expected = ["--remount-ro", "/dev"]  # with its /dev/shm: bwrap's --dev is a writable, unbounded tmpfs
    expected += ["--remount-ro", "/proc", "--remount-ro", "/", "--chdir", str(REPL_DIR)]
    expected += ["--", PYTHON, "-I", str(FAKE_REPL)]
    assert tail == expected


# -- uids, handshake, identity, the tree's memory cap, death with the worker ------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the worker must be root to give sandboxes uids")


def _owners(root: int) -> set[int]:
    owners = set()
    for pid in _tree(root):
        with contextlib.suppress(OSError):
            owners.add(os.stat(f"/proc/{pid}").st_uid)
    return owners


@needs_root
async def test_a_root_worker_gives_each_sandbox_a_uid_of_its_own(make_sandbox):
    first, second = await make_sandbox(), await make_sandbox()
    uids = [first.stats().extra["uid"], second.stats().extra["uid"]]
    assert uids[0] != uids[1]
    for sandbox, uid in zip((first, second), uids, strict=True):
        assert sandbox_uids.DEFAULT_UID_BASE <= uid < sandbox_uids.DEFAULT_UID_BASE + sandbox_uids.DEFAULT_UID_COUNT
        assert _owners(sandbox.pid) == {uid}  # every process of the tree, the sandbox tool included
        whoami = json.loads(_probe_result(await sandbox.request({"cmd": "FIXTURE:whoami"}, 5)).split(": ", 2)[2])
        assert whoami["nproc"] == 512 and int(whoami["cap_eff"], 16) == 0
    # A restart keeps the uid; kill() gives it back.
    await first.start()
    assert first.stats().extra["uid"] == uids[0]
    await first.kill()
    lease = sandbox_uids.lease(f"{first.config.state_dir}/sandbox-uids", uids[0], 1)
    lease.release()
    with pytest.raises(SandboxUnavailable, match="leased or busy"):
        sandbox_uids.lease(f"{second.config.state_dir}/sandbox-uids", uids[1], 1)


@needs_root
def test_uid_leases_are_exclusive_across_processes(tmp_path):
    lock_dir, base = str(tmp_path / "uids"), 1_590_000
    code = f"from verifier_pool import sandbox_uids; print(sandbox_uids.lease({lock_dir!r}, {base}, 1).uid)"
    other = [sys.executable, "-c", code]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    lease = sandbox_uids.lease(lock_dir, base, 1)
    try:
        blocked = subprocess.run(other, capture_output=True, text=True, env=env, check=False)
        assert blocked.returncode != 0 and "leased or busy" in blocked.stderr
    finally:
        lease.release()
    assert subprocess.run(other, capture_output=True, text=True, env=env, check=True).stdout.strip() == str(base)


@pytest.fixture
def private_dir():
    """A root-only directory outside /tmp (the unshare sandbox cannot bind from /tmp)."""
    path = Path(tempfile.mkdtemp(dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


@needs_root
async def test_an_interpreter_the_sandbox_uid_cannot_exec_fails_start_and_leaves_nothing(isolation, private_dir):
    checker = private_dir / "checker"
    checker.write_text(f"#!/bin/sh\nexec {PYTHON} -I {FAKE_REPL}\n")
    checker.chmod(0o700)  # root's alone: executable for the worker, not for the sandbox's uid
    tag = f"unexecutable-{uuid.uuid4().hex}"
    sandbox = ProcessSandbox(
        _config(
            isolation,
            argv=(str(checker),),
            ro_paths=(sys.base_prefix, str(REPL_DIR), str(private_dir)),
            env={"PROOFSTREAM_TEST_TAG": tag},
            start_timeout_s=5,
        )
    )
    with pytest.raises(SandboxUnavailable, match="handshake"):
        await sandbox.start()
    assert sandbox.pid is None
    assert _tagged(tag) == []
    assert sandbox.stats().starts == 0
    await sandbox.kill()


@needs_root
async def test_a_uid_reaches_an_interpreter_under_a_private_home(make_sandbox):
    """A uid that cannot traverse /root (0700) still runs an interpreter under it: bwrap opens bind sources as
    the uid, so such sources are bound from root's side first."""
    if Path(PYTHON).parts[1] != "root" or os.stat("/root").st_mode & 0o001:
        pytest.skip(f"the interpreter {PYTHON} is not under a /root others cannot search")
    sandbox = await make_sandbox(uid=65534)
    assert await sandbox.request({"cmd": "x"}, 5) == {"env": 0}
    bashrc = _probe_result(await sandbox.request({"cmd": "FIXTURE:read=/root/.bashrc"}, 5))
    assert bashrc.startswith("probe read: failed")


@pytest.mark.parametrize(
    "argv, timeout_s, why",
    [(("/bin/cat",), 5, "answered its handshake with"), (("/bin/sleep", "60"), 1, "did not answer its handshake")],
)
async def test_a_checker_that_fails_its_handshake_is_unavailable(isolation, argv, timeout_s, why):
    sandbox = ProcessSandbox(_config(isolation, argv=argv, start_timeout_s=timeout_s))
    with pytest.raises(SandboxUnavailable, match=why):
        await sandbox.start()
    assert sandbox.pid is None and sandbox.identity == ""


async def test_identity_is_the_checker_binary_and_argv_without_a_digest(sandbox):
    st = os.stat(PYTHON)
    described = json.dumps([PYTHON, st.st_size, st.st_mtime_ns, [PYTHON, "-I", str(FAKE_REPL)]])
    assert sandbox.identity == hashlib.sha256(described.encode()).hexdigest()[:16]


async def test_the_countdown_sandbox_binds_the_package_not_the_checkout(isolation):
    settings = VerifierSettings(tasks=["countdown"], sandbox="process")
    sandbox = pool.make_sandbox(settings, "countdown", 0, "process")
    sandbox = ProcessSandbox(dataclasses.replace(sandbox.config, isolation=isolation))
    checkout = str(Path(pool.PROJECT_ROOT))
    for path in sandbox.config.ro_paths:
        assert not Path(path, ".git").exists() and path != checkout and not checkout.startswith(path + "/"), path
    try:
        await sandbox.start()
        good = {"countdown": {"numbers": [3, 4, 5], "target": 35, "answer": "<answer>(3 + 4) * 5</answer>"}}
        assert (await sandbox.request(good, 10))["ok"] is True
        source = Path(pool.PROJECT_ROOT, "tasks", "countdown_check.py").read_bytes()
        assert sandbox.identity == hashlib.sha256(source).hexdigest()[:16]  # the handshake's digest
    finally:
        await sandbox.kill()


async def test_the_private_tmp_counts_toward_the_trees_memory_cap(make_sandbox):
    sandbox = await make_sandbox(memory_limit_bytes=256 << 20, tmp_bytes=200 << 20, fsize_limit_bytes=None)
    assert _probe_result(await sandbox.request({"cmd": "FIXTURE:fill=/tmp/held,150"}, 10)) == "probe fill: ok"
    # 150 MiB in /tmp and 150 MiB resident: each alone is under the cap, together they are not.
    with pytest.raises(SandboxCrashed, match="memory cap"):
        await sandbox.request({"cmd": "FIXTURE:grow=150"}, 10)
    assert sandbox.stats().crashes == 1
    assert await sandbox.request({"cmd": "x"}, 5) == {"env": 0}


async def test_the_watchdog_alone_caps_the_whole_tree(make_sandbox):
    """No cgroup: four processes of 150 MiB, each far under RLIMIT_AS, together over the 400 MiB cap."""
    sandbox = await make_sandbox(memory_cgroup="off", memory_limit_bytes=400 << 20)
    assert sandbox.stats().extra["memory_cgroup"] is None
    with pytest.raises(SandboxCrashed, match="memory cap"):
        await sandbox.request({"cmd": "FIXTURE:split=4,150"}, 10)
    below = await sandbox.request({"cmd": "FIXTURE:split=2,150"}, 10)
    assert (below["env"], _probe_result(below)) == (0, "split: 2")  # together under the cap: fine


@pytest.mark.skipif(memcg.parent_dir() is None, reason="no memory cgroup can be made here (none delegated)")
async def test_a_memory_cgroup_holds_the_whole_tree_where_the_host_has_one(make_sandbox):
    sandbox = await make_sandbox()
    path = sandbox.stats().extra["memory_cgroup"]
    name = os.path.basename(path)
    for pid in _tree(sandbox.pid):  # the chain's first program entered it: everything after was born inside
        with contextlib.suppress(OSError):
            memory_line = [
                line
                for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if ":memory:" in line or line.startswith("0::")
            ]
            assert any(line.endswith("/" + name) for line in memory_line), (pid, memory_line)
    limit = "memory.max" if Path(path, "memory.max").exists() else "memory.limit_in_bytes"
    assert int(Path(path, limit).read_text()) == 512 << 20
    await sandbox.kill()
    assert not os.path.exists(path)


def _describe(pids: list[int]) -> list[str]:
    """pid, parent, state and command line of each, for a failure message."""
    out = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{pid} ppid={int(stat[1])} state={stat[0].decode()} {cmd[:300]}")
        except OSError:
            out.append(f"{pid} (gone)")
    return out


def _tagged(tag: str) -> list[int]:
    """Processes whose environment carries `tag`: every process of a sandbox's chain started with it."""
    found = []
    needle = f"PROOFSTREAM_TEST_TAG={tag}".encode()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{entry}/environ").read_bytes() and _running(int(entry)):
                found.append(int(entry))
        except OSError:
            continue  # exited, or not ours to read
    return found


async def test_the_lifeline_ends_the_sandbox_once_the_workers_end_is_closed(sandbox):
    """The last line of defence alone: the worker's end of the lifeline closes (as at its death, with the
    death signals out of the picture) and every process of the sandbox ends, the namespace's init too."""
    tree = {pid: _start_time(pid) for pid in _tree(sandbox.pid)}
    assert len(tree) >= 4
    os.close(sandbox._lifeline)  # noqa: SLF001  (what the kernel does when the worker dies)
    sandbox._lifeline = None  # noqa: SLF001
    deadline = time.monotonic() + 10
    while any(_running(pid) and _start_time(pid) == start for pid, start in tree.items()):
        assert time.monotonic() < deadline, "the sandbox outlived its lifeline"
        await asyncio.sleep(0.02)


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _namespace_init_in_setup(tag: str) -> bool:
    """Whether a sandbox's pid namespace init exists that has no child yet (it is still setting up)."""
    for pid in _tagged(tag):
        with contextlib.suppress(OSError, StopIteration):
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            nspid = next(line for line in status if line.startswith("NSpid:")).split()
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().strip()
            if len(nspid) > 2 and nspid[-1] == "1" and not children:
                return True
    return False


@pytest.mark.timeout(120)
async def test_a_worker_sigkilled_during_start_leaves_no_sandbox_process(isolation):
    """A worker stand-in starts sandboxes in a loop (checkers that linger at end of input, so only the
    death-with-the-worker can end them) and is SIGKILLed at points spread over a start, and (every other
    time) at the moment a namespace's init is born, before it could arm anything: the window where bwrap's
    inner process, orphaned, would wait forever for its dead parent were it not in a pid namespace that dies
    with the worker."""
    starter = [sys.executable, str(FIXTURES / "start_sandboxes.py"), "loop", isolation]
    for i in range(30):
        tag = f"killed-{i}-{uuid.uuid4().hex[:8]}"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "PROOFSTREAM_TEST_TAG": tag}
        worker = subprocess.Popen(starter, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        worker.stdout.readline()  # one start done: the imports and the tool probe are behind us
        deadline = time.monotonic() + (0.01 * i if i % 2 else 5)  # 0 to 290 ms into the next stop and start
        while time.monotonic() < deadline and (i % 2 or not _namespace_init_in_setup(tag)):
            await asyncio.sleep(0.005 if i % 2 else 0)
        worker.kill()
        worker.wait()
        # Seconds, not at once: a chain orphaned in a window no signal covers (util-linux unshare arms its
        # child's death signal after fork) finishes its setup and the lifeline then ends it. At load 3+ on 2
        # cores (the whole suite) that can take over 10 s.
        gone_by = time.monotonic() + 30
        while _tagged(tag) and time.monotonic() < gone_by:
            await asyncio.sleep(0.05)
        left = await _persisting(tag, for_s=1.0)
        assert left == [], f"kill {i}: processes outlived their worker: {_describe(left)}"


async def _persisting(tag: str, for_s: float) -> list[int]:
    """The tagged processes that stay running for `for_s`. One scan of /proc is not a verdict: a dying
    parent's fork may still complete (seen: an unshare killed by its death signal as it forked the
    namespace's init), and that child, found by the next scan, dies a moment later with the rest."""
    seen = {pid: _start_time(pid) for pid in _tagged(tag)}
    until = time.monotonic() + for_s
    while seen and time.monotonic() < until:
        await asyncio.sleep(0.05)
        seen = {pid: start for pid, start in seen.items() if _running(pid) and _start_time(pid) == start}
    return list(seen)


@pytest.mark.timeout(90)
@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK), reason="needs root and /usr/bin/python3"
)
def test_a_non_root_worker_gets_the_same_private_root(isolation):
    """The worker itself as a non-root uid (its sandboxes then share that uid): the same root, /dev and caps.
    Not 65534: Docker's sandboxes run as that uid, and RLIMIT_NPROC counts every process of a uid."""
    uid = 1_599_500
    venv_site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
    markers = ["whoami", "listdir=/", "fill=/dev/shm/probe,1", "listdir=/run", "forkbomb=100"]
    as_uid = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    starter = ["/usr/bin/python3", str(FIXTURES / "start_sandboxes.py"), "probe", isolation, *markers]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{Path(__file__).parents[2]}:{venv_site}"}
    done = subprocess.run(
        [*as_uid, *starter], capture_output=True, text=True, timeout=60, cwd="/", check=False, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in done.stdout.splitlines() if " " in line}
    whoami, top, shm, run, forks = json.loads(lines["answers"])
    assert json.loads(whoami.split(": ", 2)[2])["uid"] in (uid, 65534)  # unshare's inner namespace: overflow
    assert set(json.loads(top.split(": ", 2)[2])) <= PROCESS_ROOT | {Path(REPL_DIR).parts[1]}
    assert "failed" in shm and "failed" in run
    assert int(forks.removeprefix("forks: ")) < 32  # start_sandboxes.py's pids_limit
    assert json.loads(lines["extra"])["uid"] == uid


@needs_root
@pytest.mark.skipif(
    process_argv.probe("bwrap") is not None or process_argv.probe("unshare") is not None,
    reason="needs both bwrap and unshare working here",
)
async def test_a_tool_the_sandbox_uid_cannot_run_is_passed_over_for_the_next_with_the_reason(tmp_path, monkeypatch):
    """A bwrap only root can execute (mode 0700 above it): a probe run as root finds it fine, and every
    sandbox would then fail to start. The probe runs as the sandbox's uid: auto isolation takes unshare, and
    a sandbox told to use bwrap says why it cannot."""
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    shutil.copy2(shutil.which("bwrap"), private / "bwrap")
    monkeypatch.setenv("PATH", f"{private}:{os.environ['PATH']}")
    process_argv.probe.cache_clear()  # its answers are per PATH as well: forget the ones of the real PATH
    try:
        assert process_argv.probe("bwrap") is None  # root can run it
        auto = ProcessSandbox(_config("auto"))
        await auto.start()
        try:
            assert auto.stats().extra["isolation"] == "unshare"
            assert await auto.request({"cmd": "2+2"}, 5) is not None
        finally:
            await auto.kill()
        told = ProcessSandbox(_config("bwrap"))
        with pytest.raises(SandboxUnavailable, match=r"bwrap exited \d+ \(as uid \d+, the sandbox's\)"):
            await told.start()
        await told.kill()
    finally:
        process_argv.probe.cache_clear()
