"""The `docker` sandbox backend: one container per sandbox, through the Docker SDK (docker-py).

Every container gets: no network (`network_mode="none"`: loopback only), a read-only root, a private
size-limited tmpfs /tmp (the only writable place), memory (swap included), CPU and pids limits, a non-root
user, all capabilities dropped, no-new-privileges, Docker's default seccomp profile, no logging (the log
driver `none`: what the checker prints reaches us over the attach stream only, never the disk) and the
labels of verifier_pool.docker_daemon, so that a restarted worker finds and removes what a dead one left
behind (`docker_daemon.remove_orphans`).

Talking to the checker: the container is created with stdin open and no TTY and attached (stdin, stdout,
stderr) before it starts, so no output can be missed; the attach socket is handed to asyncio
(verifier_pool.docker_attach: Docker's multiplexed stream, stdout to ReplStream, stderr to a bounded tail).

Lifecycle: start() creates, attaches and starts a container, and returns only once the checker in it answered
its handshake (`SandboxConfig.handshake`); a container whose checker does not answer (its command is
missing, exits, or prints something else) is removed and start() raises SandboxUnavailable, so a broken image
is the infrastructure's failure, never a crash blamed on a proof. `identity` is then the image id the
container runs (sha256:...) plus the checker's own digest when its handshake reply carries one: what judges,
for the verdict cache key. request() (verifier_pool.sandbox_base) restarts first when the container is
gone, after a request cut off mid-exchange, after `max_requests` answers, or once its memory passed
`max_memory_bytes`; a timeout or a crash kills and removes the container (a forced remove: the daemon
SIGKILLs every process in it, then removes it; killing a client would leave the container running) and
raises; kill() returns once the container is removed. Every blocking SDK call runs in a thread
(asyncio.to_thread). Memory is read from the container's cgroup files when the daemon is local
(verifier_pool.memcg: microseconds), else asked of the daemon in the background (its one-shot stats take up
to a second).

What it does NOT protect against: kernel bugs (containers share the host kernel; set `runtime="runsc"` for
gVisor where installed), a Docker daemon reachable from the worker is root on the host (whoever controls the
worker controls the host), side channels.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog

from verifier_pool import docker_attach, docker_daemon, memcg
from verifier_pool.docker_daemon import LABEL_OWNER, LABEL_SANDBOX, LABEL_SANDBOX_ID, SETUP_HINT, short
from verifier_pool.repl import ReplStream, handshake
from verifier_pool.sandbox import SandboxUnavailable
from verifier_pool.sandbox_base import EXIT_GRACE_S, StdioSandbox
from verifier_pool.sandbox_config import DockerSandboxConfig

log = structlog.get_logger("verifier_pool.docker")

COUNTDOWN_ARGV = ("python3", "-m", "tasks.countdown_check")  # in the checker image
LEAN_REPL_ARGV = ("lean-repl",)  # in the Lean image: the REPL with Mathlib's search path, cwd the project

_DAEMON_STATS_INTERVAL_S = 5.0  # the daemon's stats can take a second: asked in the background, this seldom


class DockerSandbox(StdioSandbox[DockerSandboxConfig]):
    """One checker in a container; the Sandbox protocol of verifier_pool.sandbox (its request path:
    verifier_pool.sandbox_base)."""

    backend = "docker"
    _log = log

    def __init__(self, config: DockerSandboxConfig, sandbox_id: str | None = None) -> None:
        super().__init__(config, sandbox_id)
        self.owner = config.owner or docker_daemon.default_owner()
        self._client = None
        self._container = None
        self._protocol: docker_attach.AttachProtocol | None = None
        self._recycle_due = False  # replace the container before the next request
        self._cgroup_dir: str | bool | None = None  # None: not looked up yet; False: not readable here
        # Where the cgroup is not readable: the daemon's reading, asked in the background (`_memory_reading`)
        self._daemon_asked_at = float("-inf")
        self._daemon_reading: asyncio.Task | None = None
        self._daemon_memory: int | None = None  # its answer, not yet compared with the threshold

    # -- the Sandbox protocol --------------------------------------------------------------------------

    async def start(self) -> None:
        """(Re)start: a fresh container, attached, running, and its checker answered the handshake.
        SandboxUnavailable if it cannot be; then no container of this start is left."""
        await self.kill()
        self.identity = ""  # until this start's checker answered: nothing may be judged under the last one
        self._recycle_due, self._cgroup_dir, self._daemon_memory = False, None, None
        started = time.monotonic()
        if self._client is None:
            self._client = await asyncio.to_thread(
                docker_daemon.connect, self.config.base_url, self.config.api_timeout_s
            )
        creating = asyncio.ensure_future(asyncio.to_thread(self._create))
        try:
            container = await asyncio.shield(creating)
        except asyncio.CancelledError:
            # The thread goes on and creates the container: remove it rather than leave an orphan behind.
            with contextlib.suppress(Exception):
                await asyncio.to_thread(docker_daemon.destroy, await creating)
            raise
        self._container = container
        try:
            attached = await asyncio.to_thread(
                container.attach_socket, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            protocol = await docker_attach.connect(docker_attach.raw_socket(attached), self._fresh_stderr())
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
            raise SandboxUnavailable(f"cannot start a container of {self.config.image} ({short(e)})") from e
        self._stream = ReplStream(
            protocol.stdout, docker_attach.AttachWriter(protocol), max_response_bytes=self.config.max_response_bytes
        )
        try:
            reply = await handshake(self._stream, self.config.handshake, self.config.start_timeout_s)
        except asyncio.CancelledError:  # a worker stopped while starting: no container of this start stays
            with contextlib.suppress(Exception):
                await self.kill()
            raise
        except SandboxUnavailable as e:
            detail = await self._exit_detail(wait_s=EXIT_GRACE_S if protocol.stdout.at_eof() else 0)
            with contextlib.suppress(SandboxUnavailable):  # the handshake's failure is the one to report
                await self.kill()
            raise SandboxUnavailable(f"{self.config.image} ({self.config.argv[0]} ...): {e} ({detail})") from e
        image_id = container.attrs.get("Image", "")  # the id of what runs, whatever the tag names meanwhile
        digest = reply.get("digest")
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
            await asyncio.to_thread(docker_daemon.destroy, container)
        except Exception as e:
            raise SandboxUnavailable(f"cannot remove container {container.short_id} ({short(e)})") from e

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
            raise SandboxUnavailable(f"cannot read {path} in container {container.short_id} ({short(e)})") from e
        if code != 0:
            raise OSError(f"{path} is not a readable regular file in the container (exit {code})")
        if len(data) > max_bytes:
            raise ValueError(f"{path} holds more than {max_bytes} bytes")
        return data

    # -- internals ---------------------------------------------------------------------------------------

    def _running(self) -> bool:
        return self._container is not None and self._protocol is not None and not self._protocol.closed.is_set()

    def _stdout_at_eof(self) -> bool:
        return self._protocol is not None and self._protocol.stdout.at_eof()

    def _needs_restart(self) -> bool:
        return super()._needs_restart() or self._recycle_due

    async def _recycle(self) -> None:
        self._recycle_due = True  # lazily: the next request starts the next container

    async def _discard(self) -> None:
        await self.kill()

    async def _memory_reading(self) -> int | None:
        """The container's memory from its cgroup files where this machine sees them (microseconds). Else the
        daemon's reading that arrived since the last call (or None), and the daemon is asked again in the
        background, at most every _DAEMON_STATS_INTERVAL_S: its answer takes up to a second, which no verdict
        waits for."""
        container = self._container
        used = await self._cgroup_memory(container)
        if used is not None:
            return used
        used, self._daemon_memory = self._daemon_memory, None
        now = time.monotonic()
        idle = self._daemon_reading is None or self._daemon_reading.done()
        if idle and now - self._daemon_asked_at >= _DAEMON_STATS_INTERVAL_S:
            self._daemon_asked_at = now
            self._daemon_reading = asyncio.create_task(self._ask_daemon_memory(container))
        return used

    async def _ask_daemon_memory(self, container) -> None:
        used = await asyncio.to_thread(docker_daemon.memory_bytes, container)
        if container is self._container:
            self._daemon_memory = used

    async def _cgroup_memory(self, container) -> int | None:
        """Memory from the container's cgroup files, None where they cannot be read here (remote daemon)."""
        if self._cgroup_dir is False:
            return None
        if self._cgroup_dir is None:
            pid = await asyncio.to_thread(docker_daemon.main_pid, container)
            self._cgroup_dir = (memcg.memory_dir_of(pid, container.id) if pid else None) or False
            if self._cgroup_dir is False:
                return None
        return memcg.usage_bytes(self._cgroup_dir)

    def _create(self):
        docker = docker_daemon.sdk()
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
            raise SandboxUnavailable(f"image {c.image} not found on the Docker daemon: {SETUP_HINT}") from e
        except Exception as e:
            raise SandboxUnavailable(f"cannot create a container of {c.image} ({short(e)})") from e

    async def _exit_status(self, wait_s: float) -> str | None:
        """The container's exit status, an OOM kill included."""
        container, protocol = self._container, self._protocol
        if container is None or protocol is None:
            return None
        if wait_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(protocol.closed.wait(), wait_s)
        return await asyncio.to_thread(docker_daemon.exit_state, container, wait_s)
