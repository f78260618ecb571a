"""The `docker` sandbox backend: one container per sandbox, through the Docker SDK (docker-py).

Every container gets: no network (`network_mode="none"`: loopback only), a read-only root, a private
size-limited tmpfs /tmp (the only writable place), memory (swap included), CPU and pids limits, a non-root
user, all capabilities dropped, no-new-privileges, Docker's default seccomp profile, no logging (the log
driver `none`: what the checker prints reaches us over the attach stream only, never the disk) and labels
(`proofstream.sandbox=1`, `proofstream.owner=<worker>`, `proofstream.sandbox_id=<id>`) so that a restarted
worker finds and removes what a dead one left behind (`remove_orphans`).

Talking to the checker: the container is created with stdin open and no TTY, attached (stdin, stdout,
stderr) before it starts so no output can be missed, and the attach socket is handed to asyncio. Without a
TTY the daemon multiplexes stdout and stderr on that socket in frames with an 8-byte header (stream, 0, 0, 0,
big-endian length); `_AttachProtocol` demultiplexes them: stdout goes into an asyncio.StreamReader that
`ReplStream` reads (with flow control: the socket stops being read while too much stdout is unread, so a
checker that spews output is blocked in its write(), not buffered here), stderr into a bounded tail used
in SandboxCrashed messages. stdin only ever carries JSON (json.dumps escapes every control character), so
the daemon's detach keys (ctrl-p ctrl-q) can never occur in it.

Lifecycle: start() creates, attaches and starts a container, and returns only once the checker in it answered
its handshake (`DockerSandboxConfig.handshake`); a container whose checker does not answer (its command is
missing, exits, or prints something else) is removed and start() raises SandboxUnavailable, so a broken image
is the infrastructure's failure, never a crash blamed on a proof. `identity` is then the image id the
container runs (sha256:...) plus the checker's own digest when its handshake reply carries one: what judges,
for the verdict cache key. request() (verifier_pool.sandbox_base) restarts first when the container is
gone, after a request cut off mid-exchange, after `max_requests` answers, or once its memory (cgroup usage
less inactive file cache, as `docker stats` shows it) passed `max_memory_bytes`; a timeout or a crash kills
and removes the container (a forced remove: the daemon SIGKILLs every process in it, then removes it;
killing a client would leave the container running) and raises; kill() returns once the container is
removed. Every blocking SDK call runs in a thread (asyncio.to_thread). Memory is read from the container's
cgroup files when the daemon is local (microseconds), else asked of the daemon in the background (its
one-shot stats take up to a second).

What it does NOT protect against: kernel bugs (containers share the host kernel; set `runtime="runsc"` for
gVisor where installed), a Docker daemon reachable from the worker is root on the host (whoever controls the
worker controls the host), side channels.

One file, over 400 lines, because it is one backend: the container's hardening, the attach socket and the
cgroup memory readings are how this backend isolates and talks to its checker; what it shares with the
process backend is verifier_pool/sandbox_base.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from verifier_pool import proctree
from verifier_pool.repl import DEFAULT_MAX_RESPONSE_BYTES, LEAN_HANDSHAKE, Handshake, ReplStream, handshake
from verifier_pool.sandbox import SandboxUnavailable
from verifier_pool.sandbox_base import EXIT_GRACE_S, StderrTail, StdioSandbox

log = structlog.get_logger("verifier_pool.docker")

LABEL_SANDBOX = "proofstream.sandbox"
LABEL_OWNER = "proofstream.owner"
LABEL_SANDBOX_ID = "proofstream.sandbox_id"
CHECKER_IMAGE = "proofstream-checker:latest"  # ops/deploy/images/checker/Dockerfile, by ops/deploy/docker_setup.sh
LEAN_IMAGE = "proofstream-lean:latest"  # ops/deploy/images/lean/Dockerfile
COUNTDOWN_ARGV = ("python3", "-m", "tasks.countdown_check")  # in the checker image
LEAN_REPL_ARGV = ("lean-repl",)  # in the Lean image: the REPL with Mathlib's search path, cwd the project
NOBODY = "65534:65534"

_SETUP_HINT = "run ops/deploy/docker_setup.sh (installs docker.io, starts dockerd, builds the local images)"
_STDOUT_BUFFER_BYTES = 256 * 1024  # unread stdout above 2x this pauses reading the attach socket
_FRAME_HEADER = 8
_DAEMON_STATS_INTERVAL_S = 5.0  # the daemon's stats can take a second: asked in the background, this seldom
_CGROUP_ROOT = "/sys/fs/cgroup"
_STDOUT, _STDERR, _SYSERR = 1, 2, 3  # attach stream ids (3: the daemon's own error, API >= 1.42)


@dataclass(frozen=True, slots=True)
class DockerSandboxConfig:
    image: str
    argv: tuple[str, ...]  # the container's command (the images have no ENTRYPOINT)
    workdir: str | None = None  # the checker's cwd; None: the image's WORKDIR
    env: Mapping[str, str] = field(default_factory=dict)  # added to HOME=/tmp, LANG=C.UTF-8
    user: str = NOBODY  # "uid[:gid]" or a name in the image; never root
    memory_limit_bytes: int | None = 8 << 30  # cgroup limit, swap included (kimina uses 8 GB for Mathlib)
    cpus: float | None = 1.0  # CPU quota, in CPUs (nano_cpus)
    pids_limit: int | None = 512  # processes + threads (Lean's task manager runs a thread per core)
    tmp_bytes: int = 256 << 20  # size of the tmpfs /tmp (it is memory, counted in the memory limit)
    max_requests: int | None = None  # recycle after this many answers; None: never
    max_memory_bytes: int | None = None  # recycle once the container's memory exceeds this
    # Check the memory at most this often (see memory_bytes): reading the cgroup's memory.stat after every
    # request cost ~0.17 ms, more than half the pool's CPU per Countdown check. A soft limit; the hard one is
    # the container's memory limit.
    memory_check_interval_s: float = 1.0
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    stderr_tail_bytes: int = 4096
    owner: str | None = None  # the worker's id in the owner label; None: default_owner()
    oom_score_adj: int | None = 500  # under host memory pressure the kernel kills sandboxes before the worker
    runtime: str | None = None  # an OCI runtime registered with the daemon, e.g. "runsc" (gVisor)
    base_url: str | None = None  # the daemon, e.g. "unix:///var/run/docker.sock"; None: DOCKER_HOST or default
    api_timeout_s: float = 30.0  # per Docker API call
    # Asked right after the container starts; start() returns only once the checker answered it.
    handshake: Handshake = LEAN_HANDSHAKE
    handshake_timeout_s: float = 30.0  # the checker's own start (interpreter, REPL binary), not its work

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("image is empty: give the checker image, e.g. proofstream-checker:latest")
        if not self.argv:
            raise ValueError("argv is empty: give the checker command, e.g. ('python3', '-m', 'tasks.countdown_check')")
        if self.user.split(":", 1)[0] in ("", "0", "root"):
            raise ValueError(f"user must not be root: {self.user!r}")
        for name in ("memory_limit_bytes", "cpus", "pids_limit", "max_requests", "max_memory_bytes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None, not {value}")
        if self.tmp_bytes <= 0 or self.memory_check_interval_s < 0:
            raise ValueError("tmp_bytes must be positive and memory_check_interval_s non-negative")
        if self.handshake_timeout_s <= 0:
            raise ValueError(f"handshake_timeout_s must be positive, not {self.handshake_timeout_s}")


# -- the daemon -------------------------------------------------------------------------------------------


def _docker():
    try:
        import docker  # noqa: PLC0415 - optional: only the docker backend needs the SDK
    except ImportError as e:
        raise SandboxUnavailable("the Docker SDK is not installed: pip install 'docker>=7.1'") from e
    return docker


def _connect(base_url: str | None, timeout_s: float):
    """A DockerClient (API version negotiated with the daemon). SandboxUnavailable if no daemon answers."""
    docker = _docker()
    try:
        if base_url:
            return docker.DockerClient(base_url=base_url, version="auto", timeout=timeout_s)
        return docker.from_env(version="auto", timeout=timeout_s)
    except Exception as e:  # DockerException, requests' errors, OSError: all mean "no daemon here"
        where = base_url or os.environ.get("DOCKER_HOST") or "the default socket"
        raise SandboxUnavailable(f"no Docker daemon answers at {where} ({_short(e)}): {_SETUP_HINT}") from e


def why_unavailable(image: str, *, base_url: str | None = None, timeout_s: float = 3.0) -> str | None:
    """None if a daemon answers and has `image`, else why not (for logs and test skips). Never raises."""
    try:
        client = _connect(base_url, timeout_s)
    except SandboxUnavailable as e:
        return str(e)
    try:
        client.ping()
        client.images.get(image)
    except _docker().errors.ImageNotFound:
        return f"image {image} not found on the Docker daemon: {_SETUP_HINT}"
    except Exception as e:
        return f"the Docker daemon failed to answer ({_short(e)})"
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return None


def daemon_ready(image: str, *, base_url: str | None = None) -> bool:
    """True when a Docker daemon answers and has `image` (a few ms; never raises)."""
    return why_unavailable(image, base_url=base_url) is None


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None if it does not exist."""
    stat = proctree.read_stat(pid)
    return stat[2] if stat is not None else None


_own_start_ticks = functools.cache(_start_ticks)  # this worker's, asked for every sandbox's owner label


def default_owner(prefix: str = "") -> str:
    """This worker's owner id: `<prefix><hostname>:<pid>:<start ticks>`. The start time makes it unique even
    when the pid is reused, and lets remove_orphans tell a live owner on this host from a dead one."""
    pid = os.getpid()
    return f"{prefix}{socket.gethostname()}:{pid}:{_own_start_ticks(pid) or 0}"


_OWNER = re.compile(r"(?P<host>[^:/@]+):(?P<pid>\d+):(?P<start>\d+)$")


def _owner_alive(owner: str) -> bool:
    """True only when `owner` is provably a live process on this host (same hostname, pid, start time)."""
    m = _OWNER.search(owner)
    if m is None or m["host"] != socket.gethostname():
        return False
    return _start_ticks(int(m["pid"])) == int(m["start"])


def remove_orphans(
    owner_prefix: str | None = None, *, base_url: str | None = None, spare_live_owners: bool = True
) -> list[str]:
    """Remove (kill first) every container labelled `proofstream.sandbox=1` whose owner label starts with
    `owner_prefix` (any owner if None), except, with `spare_live_owners`, those whose owner is provably alive
    on this host (this process included). Returns the ids removed. Call it at worker startup (in a thread
    from async code: it blocks). Owners on other hosts cannot be proven alive: where several workers share
    one daemon from different hosts or containers, give each a stable prefix and pass it here.
    SandboxUnavailable if no daemon answers."""
    client = _connect(base_url, 30.0)
    removed = []
    try:
        for container in client.containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}=1"}):
            owner = container.labels.get(LABEL_OWNER, "")
            if owner_prefix is not None and not owner.startswith(owner_prefix):
                continue
            if spare_live_owners and _owner_alive(owner):
                continue
            _destroy(container)
            removed.append(container.id)
            log.info("sandbox_orphan_removed", container=container.short_id, owner=owner)
    except SandboxUnavailable:
        raise
    except Exception as e:
        raise SandboxUnavailable(f"cannot list or remove orphan sandboxes ({_short(e)})") from e
    finally:
        client.close()
    return removed


def _destroy(container) -> None:
    """Kill (SIGKILL to every process in the container) and remove it, in one call: a forced remove is the
    daemon's kill then remove, half the round trips of container.kill() + container.remove(). Should the
    removal fail, container.kill() is tried on its own so that at least nothing keeps running, and the
    error is raised. Gone already, or being removed already, is fine."""
    docker = _docker()
    try:
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as e:
        if e.status_code == 409 and "already in progress" in str(e):
            return
        with contextlib.suppress(Exception):
            container.kill()
        raise


def _short(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text if len(text) <= 300 else text[:300] + "..."


# -- the attach stream ------------------------------------------------------------------------------------


class _AttachProtocol(asyncio.Protocol):
    """Demultiplexes the attach stream: stdout into `stdout`, stderr into a bounded tail."""

    def __init__(self, stderr: StderrTail) -> None:
        self.stdout = asyncio.StreamReader(limit=_STDOUT_BUFFER_BYTES)
        self.stderr = stderr
        self.closed = asyncio.Event()
        self.transport: asyncio.Transport | None = None
        self._header = bytearray()
        self._stream = 0
        self._left = 0  # payload bytes of the current frame still to come
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.stdout.set_transport(transport)  # StreamReader pauses/resumes reading on its buffer's size

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._left == 0:
                need = _FRAME_HEADER - len(self._header)
                self._header += view[:need]
                view = view[need:]
                if len(self._header) < _FRAME_HEADER:
                    return
                self._stream = self._header[0]
                self._left = int.from_bytes(self._header[4:8], "big")
                self._header.clear()
                continue
            chunk, view = view[: self._left], view[self._left :]
            self._left -= len(chunk)
            if self._stream == _STDOUT:
                self.stdout.feed_data(bytes(chunk))
            elif self._stream in (_STDERR, _SYSERR):
                self.stderr.feed(chunk)

    def eof_received(self) -> bool:
        return False  # the container's output ended: close the connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.stdout.feed_eof()
        self.closed.set()
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def writable(self) -> None:
        await self._writable.wait()


class _AttachWriter:
    """stdin of the container: write() and drain(), as ReplStream wants them."""

    def __init__(self, protocol: _AttachProtocol) -> None:
        self._protocol = protocol

    def write(self, data: bytes) -> None:
        if self._protocol.closed.is_set() or self._protocol.transport is None:
            raise ConnectionResetError("the container's stdio stream is closed")
        self._protocol.transport.write(data)

    async def drain(self) -> None:
        await self._protocol.writable()
        if self._protocol.closed.is_set():
            raise ConnectionResetError("the container's stdio stream is closed")


def _raw_socket(attached) -> socket.socket:
    """A socket of our own on the attach connection: a dup of the SDK's, whose wrappers are then closed."""
    import ssl  # noqa: PLC0415

    raw = getattr(attached, "_sock", attached)
    if isinstance(raw, ssl.SSLSocket) or not isinstance(raw, socket.socket):
        raise SandboxUnavailable(
            f"cannot drive a {type(raw).__name__} attach stream from asyncio: use a unix socket or plain tcp "
            "DOCKER_HOST (not TLS or ssh)"
        )
    ours = raw.dup()
    with contextlib.suppress(Exception):
        attached.close()
    with contextlib.suppress(Exception):
        raw.close()  # the connection stays up: `ours` still refers to it
    ours.setblocking(False)
    return ours


# -- the sandbox ------------------------------------------------------------------------------------------


class DockerSandbox(StdioSandbox):
    """One checker in a container; the Sandbox protocol of verifier_pool.sandbox (its request path:
    verifier_pool.sandbox_base)."""

    backend = "docker"
    _log = log

    def __init__(self, config: DockerSandboxConfig, sandbox_id: str | None = None) -> None:
        super().__init__(config, sandbox_id)
        self.config: DockerSandboxConfig = config
        self.owner = config.owner or default_owner()
        self._client = None
        self._container = None
        self._protocol: _AttachProtocol | None = None
        self._over_memory = False
        self._memory_checked = 0.0
        self._memory_task: asyncio.Task | None = None
        self._cgroup_dir: str | bool | None = None  # None: not looked up yet; False: not readable here

    # -- the Sandbox protocol --------------------------------------------------------------------------

    async def start(self) -> None:
        """(Re)start: a fresh container, attached, running, and its checker answered the handshake.
        SandboxUnavailable if it cannot be; then no container of this start is left."""
        await self.kill()
        self.identity = ""  # until this start's checker answered: nothing may be judged under the old one
        started = time.monotonic()
        if self._client is None:
            self._client = await asyncio.to_thread(_connect, self.config.base_url, self.config.api_timeout_s)
        creating = asyncio.ensure_future(asyncio.to_thread(self._create))
        try:
            container = await asyncio.shield(creating)
        except asyncio.CancelledError:
            # The thread goes on and creates the container: remove it rather than leave an orphan behind.
            with contextlib.suppress(Exception):
                await asyncio.to_thread(_destroy, await creating)
            raise
        self._container = container
        try:
            attached = await asyncio.to_thread(
                container.attach_socket, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            sock = _raw_socket(attached)
            loop = asyncio.get_running_loop()
            protocol = _AttachProtocol(self._fresh_stderr())
            try:
                await loop.create_connection(lambda: protocol, sock=sock)
            except BaseException:
                sock.close()
                raise
            self._protocol = protocol
            await asyncio.to_thread(container.start)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self.kill()
            raise
        except SandboxUnavailable:
            await self.kill()
            raise
        except Exception as e:
            await self.kill()
            raise SandboxUnavailable(f"cannot start a container of {self.config.image} ({_short(e)})") from e
        self._stream = ReplStream(
            protocol.stdout, _AttachWriter(protocol), max_response_bytes=self.config.max_response_bytes
        )
        try:
            reply = await handshake(self._stream, self.config.handshake, self.config.handshake_timeout_s)
        except asyncio.CancelledError:  # a worker stopped while starting: no container of this start stays
            with contextlib.suppress(Exception):
                await self.kill()
            raise
        except SandboxUnavailable as e:
            detail = await self._exit_detail(wait_s=EXIT_GRACE_S if protocol.stdout.at_eof() else 0)
            with contextlib.suppress(SandboxUnavailable):  # the handshake's failure is the one to report
                await self.kill()
            raise SandboxUnavailable(f"{self.config.image} ({self.config.argv[0]} ...): {e} ({detail})") from e
        image_id = container.attrs.get("Image", "")  # the id of what runs, whatever the tag names by now
        digest = reply.get("digest")
        self._over_memory = False
        self._memory_checked = float("-inf")
        self._cgroup_dir = None
        self._stats.extra.update(container=container.short_id, image=self.config.image)
        identity = f"{image_id}+{digest}" if isinstance(digest, str) and digest else image_id
        self._started(started, identity, container=container.short_id)

    async def kill(self) -> None:
        """Kill and remove the container (not just our connection to it); return once it is gone.
        SandboxUnavailable if the daemon fails to remove it."""
        container, self._container, self._stream = self._container, None, None
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.abort()
        if container is None:
            return
        try:
            await asyncio.to_thread(_destroy, container)
        except Exception as e:
            raise SandboxUnavailable(f"cannot remove container {container.short_id} ({_short(e)})") from e

    async def memory_bytes(self) -> int | None:
        """The container's memory as `docker stats` counts it (cgroup usage less inactive file cache), or None.

        Read from the container's cgroup files when the daemon runs on this machine (microseconds), else
        asked of the daemon (one-shot stats: up to a second, as its collector ticks)."""
        container = self._container
        if container is None:
            return None
        usage = await self._cgroup_memory(container)
        if usage is None:
            usage = await asyncio.to_thread(_daemon_memory, container)
        if usage is not None:
            self._stats.memory_bytes = usage
        return usage

    async def take_file(self, path: str, max_bytes: int) -> bytes:
        """Read and remove a regular file of the container's /tmp (the Lean REPL's pickle,
        verifier_pool.lean_audit), by a process run in the container (`docker cp` does not see a tmpfs):
        links resolve inside it, a FIFO or a stalled read ends after 30 s. Untrusted bytes, at most
        `max_bytes`: OSError if absent or not a regular file, ValueError if larger; SandboxUnavailable if no
        container runs."""
        container = self._container
        if container is None:
            raise SandboxUnavailable(f"sandbox {self.sandbox_id} has no running container to read {path} from")
        script = 'test -f "$1" && timeout 30 head -c "$2" -- "$1"; s=$?; rm -f -- "$1"; exit $s'
        argv = ["sh", "-c", script, "read_file", path, str(max_bytes + 1)]
        try:
            code, data = await asyncio.to_thread(container.exec_run, argv, stdout=True, stderr=False)
        except Exception as e:
            raise SandboxUnavailable(f"cannot read {path} in container {container.short_id} ({_short(e)})") from e
        if code != 0:
            raise OSError(f"{path} is not a readable regular file in the container (exit {code})")
        if len(data) > max_bytes:
            raise ValueError(f"{path} holds more than {max_bytes} bytes")
        return data

    # -- internals ---------------------------------------------------------------------------------------

    @property
    def container_id(self) -> str | None:
        return self._container.id if self._container is not None else None

    def _running(self) -> bool:
        return self._container is not None and self._protocol is not None and not self._protocol.closed.is_set()

    def _stdout_at_eof(self) -> bool:
        return self._protocol is not None and self._protocol.stdout.at_eof()

    def _needs_restart(self) -> bool:
        if super()._needs_restart():
            return True
        if self._over_memory or self._requests_spent():  # recycled lazily: by the next request
            log.info("sandbox_recycle", sandbox=self.sandbox_id, requests=self._stats.requests,
                     over_memory=self._over_memory)  # fmt: skip
            return True
        return False

    async def _answered(self) -> None:
        if self.config.max_memory_bytes is not None:
            await self._check_memory()

    async def _discard(self) -> None:
        await self.kill()

    async def _check_memory(self) -> None:
        now = time.monotonic()
        if now - self._memory_checked < self.config.memory_check_interval_s:
            return
        container = self._container
        usage = await self._cgroup_memory(container)
        if usage is not None:
            self._memory_checked = now
            self._stats.memory_bytes = usage
            self._over_memory = usage > self.config.max_memory_bytes
        elif now - self._memory_checked >= max(_DAEMON_STATS_INTERVAL_S, self.config.memory_check_interval_s) and (
            self._memory_task is None or self._memory_task.done()
        ):
            # Not on the request's path: the verdict is not held up by the daemon's stats collector.
            self._memory_checked = now
            self._memory_task = asyncio.create_task(self._daemon_memory_check(container))

    async def _daemon_memory_check(self, container) -> None:
        usage = await asyncio.to_thread(_daemon_memory, container)
        if usage is not None and container is self._container:
            self._stats.memory_bytes = usage
            self._over_memory = usage > self.config.max_memory_bytes

    async def _cgroup_memory(self, container) -> int | None:
        """Memory from the container's cgroup files, None where they cannot be read here (remote daemon)."""
        if self._cgroup_dir is False:
            return None
        if self._cgroup_dir is None:
            pid = await asyncio.to_thread(_main_pid, container)
            self._cgroup_dir = (_memory_cgroup_dir(pid, container.id) if pid else None) or False
            if self._cgroup_dir is False:
                return None
        return _read_cgroup_memory(self._cgroup_dir)

    def _create(self):
        docker = _docker()
        c = self.config
        kwargs: dict[str, Any] = {
            "command": list(c.argv),
            "stdin_open": True,
            "tty": False,
            "detach": True,
            "auto_remove": False,
            "network_mode": "none",
            "read_only": True,
            "tmpfs": {"/tmp": f"size={c.tmp_bytes},mode=1777,nosuid,nodev"},
            "user": c.user,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "environment": {"HOME": "/tmp", "LANG": "C.UTF-8", **c.env},
            "labels": {LABEL_SANDBOX: "1", LABEL_OWNER: self.owner, LABEL_SANDBOX_ID: self.sandbox_id},
            "log_config": docker.types.LogConfig(type="none"),
        }
        if c.workdir:
            kwargs["working_dir"] = c.workdir
        if c.memory_limit_bytes is not None:
            kwargs["mem_limit"] = c.memory_limit_bytes
            kwargs["memswap_limit"] = c.memory_limit_bytes  # the same: no swap
        if c.cpus is not None:
            kwargs["nano_cpus"] = int(c.cpus * 1e9)
        if c.pids_limit is not None:
            kwargs["pids_limit"] = c.pids_limit
        if c.oom_score_adj is not None:
            kwargs["oom_score_adj"] = c.oom_score_adj
        if c.runtime:
            kwargs["runtime"] = c.runtime
        try:
            return self._client.containers.create(c.image, **kwargs)
        except docker.errors.ImageNotFound as e:
            raise SandboxUnavailable(f"image {c.image} not found on the Docker daemon: {_SETUP_HINT}") from e
        except Exception as e:
            raise SandboxUnavailable(f"cannot create a container of {c.image} ({_short(e)})") from e

    async def _exit_status(self, wait_s: float) -> str | None:
        """The container's exit status, an OOM kill included."""
        container, protocol = self._container, self._protocol
        if container is None or protocol is None:
            return None
        if wait_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(protocol.closed.wait(), wait_s)
        return await asyncio.to_thread(_exit_state, container, wait_s)


def _exit_state(container, wait_s: float) -> str:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            container.reload()
        except Exception as e:
            return f"state unknown ({_short(e)})"
        state = container.attrs.get("State", {})
        if not state.get("Running") or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if state.get("Running"):
        return "still running"
    oom = ", killed by the memory limit (OOM)" if state.get("OOMKilled") else ""
    return f"exit status {state.get('ExitCode')}{oom}"


def _main_pid(container) -> int | None:
    try:
        container.reload()
    except Exception:
        return None
    return container.attrs.get("State", {}).get("Pid") or None


def _memory_cgroup_dir(pid: int, container_id: str) -> str | None:
    """The container's memory cgroup directory as this machine sees it (cgroup v1 or v2), or None."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None  # the daemon is remote, or its pids are not visible from here
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            candidates.append(os.path.join(_CGROUP_ROOT, "memory", path.lstrip("/")))
        elif controllers == "":
            candidates.append(os.path.join(_CGROUP_ROOT, path.lstrip("/")))
    for directory in candidates:
        # The id check guards against a pid already reused by another process.
        if container_id in directory and _read_cgroup_memory(directory) is not None:
            return directory
    return None


def _read_cgroup_memory(directory: str) -> int | None:
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
    inactive = int(stat.get("total_inactive_file", stat.get("inactive_file", 0)))
    return max(0, usage - inactive)


def _daemon_memory(container) -> int | None:
    try:
        stats = container.stats(stream=False, one_shot=True)
    except Exception:
        return None
    memory = stats.get("memory_stats") or {}
    if "usage" not in memory:  # not running any more
        return None
    detail = memory.get("stats") or {}
    inactive = detail.get("total_inactive_file", detail.get("inactive_file", 0))  # cgroup v1 / v2
    return max(0, memory["usage"] - inactive)
