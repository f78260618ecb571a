"""The `docker` sandbox, for real: a Docker daemon, the checker image (ops/deploy/images/checker, built by
ops/deploy/docker_setup.sh), the Countdown checker and the fake REPL (ops/bench/synthetic_repl.py, a test double
driven by FIXTURE: markers, passed to the container's python3 as `-c` source, so nothing is mounted). The
assertions are about our sandbox, never about Lean. Without a daemon or the image these tests skip and say
why (run ops/deploy/docker_setup.sh); the last two run everywhere. What every backend does alike is in
test_sandbox_probes.py; Docker's attach stream without a daemon in test_docker_attach.py."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import time

import pytest

from tests.verifier_pool.sandboxes import FAKE_REPL_ARGV, IMAGE, NO_DOCKER, OWNER, RUN, Started
from tests.verifier_pool.sandboxes import config as sandbox_config
from verifier_pool import docker_daemon
from verifier_pool.docker_backend import COUNTDOWN_ARGV, DockerSandbox
from verifier_pool.docker_daemon import LABEL_OWNER, LABEL_SANDBOX, LABEL_SANDBOX_ID
from verifier_pool.pool import COUNTDOWN_HANDSHAKE
from verifier_pool.sandbox import SandboxCrashed, SandboxTimeout, SandboxUnavailable
from verifier_pool.sandbox_config import NOBODY

pytestmark = pytest.mark.timeout(60)

# A Countdown checker built from other code: it answers the handshake as one, with another digest (what an
# image built before tasks/countdown_check.py was edited answers).
STALE_CHECKER_ARGV = (
    "python3",
    "-c",
    "import json, sys\nfor line in sys.stdin:\n    if line.strip():\n"
    "        print(json.dumps({'checker': 'countdown', 'digest': '0' * 16}) + '\\n', flush=True)",
)
LIMITS = {"cpus": 1.0, "pids_limit": 64, "tmp_bytes": 16 << 20}  # what the assertions find on the container
_config = functools.partial(sandbox_config, "docker", **LIMITS)

if NO_DOCKER is not None:
    print(f"docker sandbox tests skipped: {NO_DOCKER}")
needs_docker = pytest.mark.skipif(NO_DOCKER is not None, reason=f"docker sandbox tests skipped: {NO_DOCKER}")

# Answers one framed request with what the sandbox looks like from inside; argv[1] is the bridge gateway.
PROBE = r"""
import json, os, socket, sys
while sys.stdin.readline().strip():  # the handshake (the Lean one, DockerSandboxConfig's default)
    pass
sys.stdout.write(json.dumps({"message": "Unknown environment."}) + "\n\n")
sys.stdout.flush()
while sys.stdin.readline().strip():
    pass
def attempt(action):
    try:
        action()
        return "ok"
    except OSError as e:
        return f"failed: {e.strerror or e}"
def write(path):
    with open(path, "w") as f:
        f.write("probe")
def dns_query(server):  # one UDP query for "localhost": the name needs no outside host, the query a route out
    query = bytes.fromhex("123401000001000000000000") + b"\x09localhost\x00\x00\x01\x00\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(query, (server, 53))
def nameservers():  # the resolv.conf's IPv4 servers outside the sandbox's own loopback
    try:
        lines = open("/etc/resolv.conf").read().splitlines()
    except OSError:
        return []
    found = [line.split()[1] for line in lines if line.startswith("nameserver") and len(line.split()) > 1]
    return [a for a in found if "." in a and not a.startswith("127.")]
def read_first(*paths):
    for path in paths:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            pass
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
tmp = os.statvfs("/tmp")
result = {
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "cap_eff": status["CapEff"].strip(), "cap_prm": status["CapPrm"].strip(), "cap_bnd": status["CapBnd"].strip(),
    "no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    "write_root": attempt(lambda: write("/probe")),
    "write_app": attempt(lambda: write("/opt/proofstream/tasks/probe.py")),
    "write_etc": attempt(lambda: write("/etc/passwd")),
    "write_tmp": attempt(lambda: write("/tmp/probe")),
    "tmp_bytes": tmp.f_blocks * tmp.f_frsize,
    "interfaces": sorted(os.listdir("/sys/class/net")),
    "net_gateway": attempt(lambda: socket.create_connection((sys.argv[1], 2375), timeout=2).close()),
    "net_public": attempt(lambda: socket.create_connection(("1.1.1.1", 53), timeout=2).close()),
    "dns": {server: attempt(lambda: dns_query(server)) for server in [sys.argv[1], *nameservers()]},
    "pids_max": read_first("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max"),
}
sys.stdout.write(json.dumps(result) + "\n\n")
sys.stdout.flush()
"""


def _docker_client():
    import docker

    return docker.from_env()


def _containers(**labels) -> list:
    filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
    client = _docker_client()
    try:
        return client.containers.list(all=True, filters=filters)
    finally:
        client.close()


def _of(sandbox: DockerSandbox) -> list:
    """The containers of `sandbox` the daemon holds, running or not."""
    return _containers(**{LABEL_SANDBOX_ID: sandbox.sandbox_id})


def _running_container(sandbox: DockerSandbox) -> str:
    """The id of the container `sandbox` started last."""
    return sandbox.stats().extra["container"]


def _exists(container_id: str) -> bool:
    import docker

    client = _docker_client()
    try:
        client.containers.get(container_id)
        return True
    except docker.errors.NotFound:
        return False
    finally:
        client.close()


def _host_address() -> str:
    """This machine's outbound address (which the bridge network would reach), found without sending."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("1.1.1.1", 53))
            return probe.getsockname()[0]
        except OSError:
            return "172.17.0.1"  # Docker's default bridge gateway


@pytest.fixture
async def make_sandbox():
    """Factory of started sandboxes, all killed at teardown; then none of this run's containers is left."""
    async with Started("docker", **LIMITS) as started:
        yield started
    assert _containers(**{LABEL_OWNER: OWNER}) == []


@needs_docker
async def test_countdown_in_a_hardened_container(make_sandbox):
    sandbox = await make_sandbox(argv=COUNTDOWN_ARGV, handshake=COUNTDOWN_HANDSHAKE)
    good = {"countdown": {"numbers": [3, 4, 5], "target": 35, "answer": "<answer>(3 + 4) * 5</answer>"}}
    assert (await sandbox.request(good, 10))["ok"] is True
    bad = {"countdown": {"numbers": [3, 4, 5], "target": 35, "answer": "7 * 5"}}
    assert (await sandbox.request(bad, 10))["reason"] == "numbers"
    stats = sandbox.stats()
    assert (stats.backend, stats.starts, stats.requests, stats.total_requests) == ("docker", 1, 2, 2)

    client = _docker_client()
    attrs = client.api.inspect_container(_running_container(sandbox))
    client.close()
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert not host["Privileged"]
    assert (host["Memory"], host["MemorySwap"]) == (512 << 20, 512 << 20)
    assert (host["NanoCpus"], host["PidsLimit"]) == (1_000_000_000, 64)
    assert host["Tmpfs"] == {"/tmp": f"size={16 << 20},mode=1777,nosuid,nodev"}
    assert host["LogConfig"]["Type"] == "none"
    assert host["AutoRemove"] is False and host["OomScoreAdj"] == 500
    assert attrs["Config"]["User"] == NOBODY
    labels = attrs["Config"]["Labels"]  # the image's own labels come along
    assert labels[LABEL_SANDBOX] == "1"
    assert labels[LABEL_OWNER] == OWNER
    assert labels[LABEL_SANDBOX_ID] == sandbox.sandbox_id


@needs_docker
async def test_probes_from_inside_fail(make_sandbox):
    sandbox = await make_sandbox(argv=("python3", "-c", PROBE, _host_address()))
    seen = await sandbox.request({"probe": 1}, 10)
    assert seen["uid"] == seen["euid"] == seen["gid"] == 65534 and seen["groups"] in ([], [65534])
    assert int(seen["cap_eff"], 16) == int(seen["cap_prm"], 16) == int(seen["cap_bnd"], 16) == 0
    assert seen["no_new_privs"] == "1" and seen["seccomp"] == "2"  # Docker's default seccomp filter
    for where in ("write_root", "write_app", "write_etc"):
        assert seen[where].startswith("failed: Read-only file system"), (where, seen[where])
    assert seen["write_tmp"] == "ok" and seen["tmp_bytes"] == 16 << 20
    assert seen["interfaces"] == ["lo"]
    assert seen["net_gateway"] == seen["net_public"] == "failed: Network is unreachable"
    assert seen["dns"] and all(r == "failed: Network is unreachable" for r in seen["dns"].values()), seen["dns"]
    assert seen["pids_max"] == "64"


@needs_docker
async def test_hang_is_killed_and_its_container_removed(make_sandbox):
    sandbox = await make_sandbox()
    forked = await sandbox.request({"cmd": "FIXTURE:forkbomb=5"}, 10)  # children that a lazy kill would miss
    assert forked["messages"][0]["data"] == "forks: 5"
    first = _running_container(sandbox)
    started = time.monotonic()
    with pytest.raises(SandboxTimeout):
        await sandbox.request({"cmd": "FIXTURE:hang"}, 0.5)
    assert time.monotonic() - started < 0.5 + 2.0  # the timeout, then kill and remove
    assert not _exists(first)
    assert _of(sandbox) == []
    assert sandbox.stats().timeouts == 1
    assert await sandbox.request({"cmd": "x"}, 10) == {"env": 0}  # a fresh container on the next request
    assert _running_container(sandbox) != first and sandbox.stats().starts == 2
    await sandbox.kill()
    assert _of(sandbox) == []


@needs_docker
async def test_crash_reports_exit_status_and_stderr(make_sandbox):
    sandbox = await make_sandbox()
    assert await sandbox.request({"cmd": "x"}, 10) == {"env": 0}
    crashed = _running_container(sandbox)
    with pytest.raises(SandboxCrashed, match="Stack overflow detected") as caught:
        await sandbox.request({"cmd": "FIXTURE:crash"}, 10)
    assert "exit status 134" in str(caught.value)
    assert not _exists(crashed)
    assert await sandbox.request({"cmd": "x"}, 10) == {"env": 0}
    stats = sandbox.stats()
    assert (stats.crashes, stats.starts, stats.total_requests) == (1, 2, 2)


@needs_docker
async def test_memory_limit_is_the_containers_not_the_machines(make_sandbox):
    sandbox = await make_sandbox(memory_limit_bytes=96 << 20)
    with pytest.raises(SandboxCrashed, match=r"exit status 137, killed by the memory limit"):
        await sandbox.request({"cmd": "FIXTURE:grow=200"}, 10)
    assert await sandbox.request({"cmd": "x"}, 10) == {"env": 0}


@needs_docker
async def test_fork_bomb_stops_at_the_pids_limit(make_sandbox):
    sandbox = await make_sandbox(pids_limit=16)
    forked = await sandbox.request({"cmd": "FIXTURE:forkbomb=256"}, 10)
    assert int(forked["messages"][0]["data"].removeprefix("forks: ")) < 16
    assert await sandbox.request({"cmd": "x"}, 10) == {"env": 1}  # still serving


@needs_docker
async def test_recycled_after_max_requests(make_sandbox):
    sandbox = await make_sandbox(max_requests=3)
    first = _running_container(sandbox)
    envs = [(await sandbox.request({"cmd": "x"}, 10))["env"] for _ in range(5)]
    assert envs == [0, 1, 2, 0, 1]
    assert sandbox.stats().starts == 2 and not _exists(first)


@needs_docker
async def test_orphans_of_a_dead_worker_are_removed(make_sandbox):
    live = await make_sandbox()
    # A worker that died (SIGKILL) without killing its sandbox: its container is left running. Its pid is
    # ours now (reused), but its start time is not.
    dead_owner = f"{RUN}/{socket.gethostname()}:{os.getpid()}:1"
    orphan = DockerSandbox(_config(owner=dead_owner))
    await orphan.start()
    orphan_id = _running_container(orphan)

    removed = await asyncio.to_thread(docker_daemon.remove_orphans, owner_prefix=RUN)
    assert [full[: len(orphan_id)] for full in removed] == [orphan_id]
    assert not _exists(orphan_id)
    assert await live.request({"cmd": "x"}, 10) == {"env": 0}  # a live owner's sandbox is spared
    assert _containers(**{LABEL_OWNER: dead_owner}) == []


@needs_docker
async def test_missing_image_is_unavailable():
    missing = "proofstream-does-not-exist:never"
    assert docker_daemon.daemon_ready(missing) is False
    assert "not found" in docker_daemon.why_unavailable(missing)
    assert docker_daemon.daemon_ready(IMAGE) is True
    sandbox = DockerSandbox(_config(image=missing))
    with pytest.raises(SandboxUnavailable, match="not found"):
        await sandbox.start()
    assert (sandbox.identity, sandbox.stats().starts) == ("", 0)
    assert _of(sandbox) == []


def _in_image(code: str) -> str:
    client = _docker_client()
    try:
        return client.containers.run(IMAGE, ["python3", "-c", code], remove=True).decode().strip()
    finally:
        client.close()


@needs_docker
async def test_identity_is_the_image_id_and_the_checkers_digest(make_sandbox):
    client = _docker_client()
    image_id = client.images.get(IMAGE).id
    client.close()
    assert image_id.startswith("sha256:")
    # The Countdown checker's handshake digest, computed here from the copy inside the image.
    source = "/opt/proofstream/tasks/countdown_check.py"
    digest = _in_image(f"import hashlib; print(hashlib.sha256(open({source!r}, 'rb').read()).hexdigest()[:16])")
    countdown = await make_sandbox(argv=COUNTDOWN_ARGV, handshake=COUNTDOWN_HANDSHAKE)
    assert countdown.identity == f"{image_id}+{digest}"
    repl = await make_sandbox()  # the REPL's handshake reply carries no digest: the image id alone
    assert repl.identity == image_id


@needs_docker
@pytest.mark.parametrize(
    "argv, handshake, why",
    [
        (("/nonexistent/checker",), None, "cannot start a container"),  # the runtime cannot exec it
        (("python3", "-c", "import sys; sys.exit(3)"), None, "exit status 3"),  # exits before answering
        (COUNTDOWN_ARGV, None, "answered its handshake with"),  # a checker, not the one asked for
        (FAKE_REPL_ARGV, COUNTDOWN_HANDSHAKE, "did not answer its handshake.*exit status 1"),  # it crashed on it
        (STALE_CHECKER_ARGV, COUNTDOWN_HANDSHAKE, "other than this checkout's.*rebuild it"),  # judges by old rules
    ],
)
async def test_a_command_that_cannot_start_is_unavailable_and_leaves_no_container(argv, handshake, why):
    overrides = {"argv": argv} | ({"handshake": handshake} if handshake else {})
    sandbox = DockerSandbox(_config(**overrides))
    with pytest.raises(SandboxUnavailable, match=why):
        await sandbox.start()
    assert (sandbox.identity, sandbox.stats().starts) == ("", 0)
    assert _of(sandbox) == []
    # A request restarts it first: the same failure, as SandboxUnavailable, never as a crash of the input.
    with pytest.raises(SandboxUnavailable, match=why):
        await sandbox.request({"cmd": "x"}, 10)
    assert _of(sandbox) == []


@needs_docker
async def test_a_checker_that_never_answers_its_handshake_is_unavailable():
    sandbox = DockerSandbox(_config(argv=("python3", "-c", "import time; time.sleep(60)"), start_timeout_s=1))
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable, match="did not answer its handshake"):
        await sandbox.start()
    assert time.monotonic() - started < 1 + 10
    assert _of(sandbox) == []


@needs_docker
async def test_a_start_cancelled_during_the_handshake_leaves_no_container():
    sandbox = DockerSandbox(_config(argv=("python3", "-c", "import time; time.sleep(60)")))
    starting = asyncio.create_task(sandbox.start())
    deadline = time.monotonic() + 30
    while sandbox._stream is None:  # attached and started: now in the handshake
        assert time.monotonic() < deadline and not starting.done()
        await asyncio.sleep(0.05)
    assert [c.status for c in _of(sandbox)] == ["running"]
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert _of(sandbox) == []


async def test_no_daemon_is_unavailable_fast():
    nowhere = "unix:///nonexistent/docker.sock"
    started = time.monotonic()
    assert docker_daemon.daemon_ready(IMAGE, base_url=nowhere) is False
    with pytest.raises(SandboxUnavailable):
        await DockerSandbox(_config(base_url=nowhere)).start()
    assert time.monotonic() - started < 5


def test_config_refuses_root_and_nonsense():
    for user in ("root", "0", "0:0", ""):
        with pytest.raises(ValueError, match="root"):
            _config(user=user)
    with pytest.raises(ValueError):
        _config(argv=())
    with pytest.raises(ValueError):
        _config(pids_limit=0)
    assert json.loads(json.dumps(_config().argv[:2])) == ["python3", "-c"]
