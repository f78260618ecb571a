"""The `process` sandbox backend: a checker (the Lean REPL, the Countdown checker) run under bubblewrap, or
under util-linux's `unshare` where bwrap is missing, for machines without Docker. It blocks what the docker
backend blocks (tests/verifier_pool/test_sandbox_probes.py tries each from inside, on every backend here).

What every sandbox gets:
- its own host uid when the worker is root (verifier_pool.sandbox_uids: a leased uid from an unused range,
  unique on the host), so RLIMIT_NPROC binds and each sandbox has a process quota of its own: a
  neighbour's fork bomb cannot stall another's restart. Paths the sandbox needs but its uid cannot reach
  (an interpreter under /root, mode 0700) are bound from the root side first (process_argv.STAGE: a private mount
  namespace where root binds them under a traversable directory), never by loosening host permissions.
  A non-root worker's sandboxes all run as the worker's uid: they share its process quota.
- a private root (the same on both tools): an empty tmpfs holding read-only binds of /usr, the /bin /sbin
  /lib* symlinks or dirs, a few /etc files for the dynamic linker, and `ro_paths` (+ `workdir`); nothing
  else of the host (no /run, /var/run, /root, /home, no host unix socket, no checkout beyond what is
  bound); a fresh read-only /proc; a read-only /dev with the usual character devices (no writable
  /dev/shm); a private size-limited tmpfs /tmp, the only writable place.
- new user, pid, network (nothing but its own loopback, so no abstract unix socket of the host either),
  ipc, uts and mount namespaces; no capabilities; no nested user namespace beyond the one that locks the
  mounts.
- rlimits through `prlimit` (inherited across exec and fork): RLIMIT_AS (address space, per process),
  RLIMIT_CPU (lifetime CPU seconds, a backstop), RLIMIT_FSIZE, RLIMIT_NPROC (`pids_limit`: the uid's processes).
- one memory cap for the whole tree, `memory_limit_bytes`, twice over: a memory cgroup where the host lets
  the worker make one (verifier_pool.memcg: cgroup v2 with the memory controller delegated, or a writable
  v1 memory hierarchy; the chain's first program enters it, so every process is born inside), and always
  a watchdog that polls the tree's anonymous and shared memory (PSS, resident or swapped: what the kernel
  cannot reclaim; proctree.charged_bytes) plus its private /tmp's usage every `memory_poll_s` during each
  request and, past the cap, kills the tree. Either way the request raises SandboxCrashed("memory cap
  ...") when the checker died of it, so the checkers' "crash twice -> rejected" rule applies (a memory
  bomb is the input's fault); under a cgroup the kernel may instead kill only a child, and the checker
  answers without it.
- a handshake (verifier_pool.repl.Handshake): start() returns only once the checker answered it, else it
  kills the tree and raises SandboxUnavailable (an interpreter the uid cannot exec, a missing toolchain).
  `identity` is the reply's "digest", or a digest of the checker binary (path, size, mtime) and argv.
- a clean environment (PATH, HOME=/tmp, LANG=C.UTF-8 plus `env`): the worker's secrets never reach it.
- death with the worker, however it dies, even during start(): the chain's leader gets PDEATHSIG from
  `setpriv` (after any uid change, which clears it) and a guard then checks that its parent is still the
  worker (closing the gap between fork and prctl); the sandbox tool runs as the init of a pid namespace
  that dies with the leader (unshare --kill-child), so the kernel kills everything under it. That is what
  bwrap alone missed: its inner process arms its own death signal only after its setup, and one orphaned
  before that waited forever for its dead parent (the bwrap a SIGKILLed worker left running). Last, a
  lifeline pipe (process_argv.LIFELINE) whose only write end the worker holds kills the checker from inside at EOF.
- its stderr drained continuously; the last few KB go into SandboxCrashed messages.
- replacement: right after a timeout or crash, after `max_requests` answers, or once the tree's resident
  memory passed `max_memory_bytes` (Lean REPLs grow), the checker is killed and the next one started at
  once, so that `stats().starts` changes before the next request (callers key REPL env ids on it).

What it does NOT protect against:
- kernel bugs: no seccomp filter, every syscall is reachable, and user namespaces widen that surface.
- memory between two polls, where no cgroup can be made (a non-root worker without a delegated cgroup v2
  subtree): a tree may overshoot the cap by what it allocates in `memory_poll_s` (RLIMIT_AS still caps
  each process), and SysV shared memory that no process maps any longer is counted by nobody (it dies
  with the ipc namespace). File-backed pages are not counted by the watchdog (the kernel reclaims them).
- CPU share: RLIMIT_CPU is a lifetime total, not a quota; a busy checker competes with its neighbours until
  its wall-clock timeout.
- a non-root worker: every sandbox runs as the worker's uid and shares its RLIMIT_NPROC quota (a fork bomb
  in one can make a neighbour's restart fail until the bomb's request times out) and may read what that
  uid may read among the bound paths.
- an explicit `uid` shared by several sandboxes: they share its process quota. Leave `uid` unset.
- reading what is bound: the uid can read everything in the bound paths it has permission for; side
  channels (timing, /proc/cpuinfo). A unix socket inside a bound path answers (a read-only bind does not
  stop connect()): bind toolchain directories, never a directory where a service keeps its socket.

This module starts, watches and kills the isolated process tree; its launch chain and argv are
verifier_pool/process_argv.py, its settings verifier_pool/sandbox_config.py, what it shares with the docker
backend verifier_pool/sandbox_base.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import stat
import time
from typing import Any

import structlog

from verifier_pool import memcg, proctree, sandbox_uids
from verifier_pool.process_argv import checker_digest, checker_env, launch_argv, probe
from verifier_pool.repl import ReplStream, handshake
from verifier_pool.sandbox import SandboxCrashed, SandboxTimeout, SandboxUnavailable
from verifier_pool.sandbox_base import EXIT_GRACE_S, StderrTail, StdioSandbox
from verifier_pool.sandbox_config import ISOLATION_TOOLS, ProcessSandboxConfig

log = structlog.get_logger("verifier_pool.process")

_INSTALL_HINT = (
    "install bubblewrap (`apt-get install -y bubblewrap`), or util-linux's unshare with unprivileged user "
    "namespaces enabled (sysctl user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1 on older "
    "Debian; kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap on Ubuntu >= 23.10)"
)
_GONE_TIMEOUT_S = 2.0  # kill() waits this long for the tree to vanish; SIGKILL'd processes exit in ms
_LEADER_EXIT_S = 0.5  # bwrap/unshare exit within ms of their child's death


def available() -> str | None:
    """The isolation tool that works on this machine ("bwrap" or "unshare"), or None."""
    return next((tool for tool in ISOLATION_TOOLS if probe(tool) is None), None)


class ProcessSandbox(StdioSandbox[ProcessSandboxConfig]):
    """One checker under bwrap/unshare; the Sandbox protocol of verifier_pool.sandbox (its request path:
    verifier_pool.sandbox_base)."""

    backend = "process"
    _log = log

    def __init__(self, config: ProcessSandboxConfig, sandbox_id: str | None = None) -> None:
        super().__init__(config, sandbox_id)
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr_task: asyncio.Task | None = None
        self._status_transport: asyncio.ReadTransport | None = None
        self._uid_lease: sandbox_uids.UidLease | None = None
        self._over_cap: str | None = None  # set by the memory watchdog when it killed the tree
        self._watchdog: asyncio.TimerHandle | None = None  # the memory watchdog's next reading, during a request
        # The cgroup's OOM kills when the running checker answered its handshake: a crash with more was the cap's
        # (read once a start, not once a request: the read cost a Countdown check ~8% more CPU).
        self._oom_kills = 0
        self._cgroup: memcg.MemoryCgroup | None = None  # made on the first start, kept across restarts
        self._lifeline: int | None = None  # the write end of the running sandbox's lifeline (LIFELINE)

    # -- the Sandbox protocol --------------------------------------------------------------------------

    async def start(self) -> None:
        """(Re)start the checker; returns once it answered its handshake. SandboxUnavailable if it cannot."""
        await self._stop()
        status_read, status_write = os.pipe()
        lifeline_read, self._lifeline = os.pipe()  # not inheritable: no other sandbox gets this write end
        try:
            tool, argv = await asyncio.to_thread(self._argv, status_write, lifeline_read)
            started = time.monotonic()
            self._proc = await self._spawn(argv, status_write, lifeline_read)
        except BaseException:
            os.close(status_read)
            self._close_lifeline()
            raise
        finally:
            os.close(status_write)  # the sandbox holds its own copy; EOF on ours means it gave up
            os.close(lifeline_read)
        self._stderr_task = asyncio.create_task(_drain_stderr(self._proc.stderr, self._fresh_stderr()))
        self._stream = ReplStream(
            self._proc.stdout, self._proc.stdin, max_response_bytes=self.config.max_response_bytes
        )
        try:
            if not await self._read_status(status_read):
                raise SandboxUnavailable(f"{tool} could not set up the sandbox")
            reply = await handshake(self._stream, self.config.handshake, self.config.start_timeout_s)
            identity = reply.get("digest") or await asyncio.to_thread(checker_digest, self.config)
        except (SandboxUnavailable, OSError) as e:
            detail = await self._exit_detail(wait_s=EXIT_GRACE_S)
            await self._stop()
            raise SandboxUnavailable(f"{e} ({detail})") from e
        except BaseException:  # cancelled: nothing of a half-started sandbox stays behind
            await self._stop()
            raise
        if self._stats.starts == 0 and self.config.uid is not None and os.geteuid() == 0:
            hint = "sandboxes given one uid share its process quota; leave uid unset for a uid each"
            log.warning("sandbox_uid_given", sandbox=self.sandbox_id, uid=self.config.uid, hint=hint)
        self._oom_kills = self._cgroup.oom_kills() if self._cgroup is not None else 0
        self._stats.extra["isolation"] = tool
        self._stats.extra["uid"] = self._uid()
        self._stats.extra["memory_cgroup"] = self._cgroup.path if self._cgroup is not None else None
        self._started(started, str(identity), isolation=tool, uid=self._uid())

    async def kill(self) -> None:
        """Stop the checker for good (until the next start): the whole tree, then the uid's lease."""
        await self._stop()
        lease, self._uid_lease = self._uid_lease, None
        if lease is not None:
            lease.release()
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is not None:
            cgroup.remove()

    async def take_file(self, path: str, max_bytes: int) -> bytes:
        """Read and remove a regular file of the running checker's private /tmp as its processes see it (the
        Lean REPL's pickle, verifier_pool.lean_audit). The sandbox wrote it, so it is untrusted: never
        followed through a link (an absolute symlink would resolve on this side of /proc/<pid>/root), never
        a FIFO, at most `max_bytes`. OSError if absent or not a regular file, ValueError if larger;
        SandboxUnavailable if no checker runs."""
        pids = proctree.tree_pids(self._proc.pid) if self.pid is not None else []
        if len(pids) < 2:
            raise SandboxUnavailable(f"sandbox {self.sandbox_id} has no running checker to read {path} from")
        return await asyncio.to_thread(_take_inside, pids[-1], path, max_bytes)

    # -- internals ---------------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The sandbox's leader (the chain ending in bwrap/unshare): its pid is also the process group id.
        None if not running."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    def _uid(self) -> int:
        if self.config.uid is not None:
            return self.config.uid
        return self._uid_lease.uid if self._uid_lease is not None else os.geteuid()

    def _running(self) -> bool:
        return self.pid is not None

    def _stdout_at_eof(self) -> bool:
        return self._proc is not None and self._proc.stdout.at_eof()

    async def _exchange(self, stream: ReplStream, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """The exchange under the memory watchdog; a death the memory cap caused is a crash that says so."""
        proc = self._proc
        assert proc is not None
        self._over_cap = None
        if self.config.memory_limit_bytes is not None:
            self._watchdog = asyncio.get_running_loop().call_later(self.config.memory_poll_s, self._watch_memory, proc)
        try:
            try:
                return await stream.exchange(payload, timeout_s)
            finally:
                if self._watchdog is not None:
                    self._watchdog.cancel()
                    self._watchdog = None
        except SandboxTimeout as e:
            if self._over_cap is not None:  # killed by the watchdog as the timer fired
                raise SandboxCrashed(self._over_cap) from e
            raise
        except SandboxCrashed as e:
            if self._over_cap is None and self._cgroup is not None and self._cgroup.oom_kills() > self._oom_kills:
                cap = self.config.memory_limit_bytes
                self._over_cap = f"memory cap: the kernel killed the sandbox's processes at its cgroup's {cap} bytes"
            if self._over_cap is not None:
                raise SandboxCrashed(self._over_cap) from e
            raise

    async def _recycle(self) -> None:
        await self._replace()

    async def _discard(self) -> None:
        await self._replace()

    async def _memory_reading(self) -> int | None:
        """The tree's resident memory (walking its /proc: ~0.6 ms)."""
        return proctree.resident_bytes(proctree.tree_pids(self.pid)) if self.pid is not None else None

    def _watch_memory(self, proc: asyncio.subprocess.Process) -> None:
        """Every `memory_poll_s` during one request: kill the tree once its resident memory plus its /tmp pass
        the cap. A timer re-armed by each reading (a task per request cost a Countdown check ~5% more CPU);
        the request cancels the one pending when it ends."""
        cap = self.config.memory_limit_bytes
        if proc.returncode is not None:
            return
        pids = proctree.tree_pids(proc.pid)
        used = proctree.charged_bytes(pids)
        if used <= cap and len(pids) > 1:  # /tmp is seen through any process inside: the last one
            used += proctree.tmpfs_used_bytes(pids[-1], "/tmp")
        if used > cap:
            self._over_cap = f"memory cap: the sandbox's processes and /tmp held {used} bytes > {cap}"
            log.warning("sandbox_memory_cap", sandbox=self.sandbox_id, used_bytes=used, cap_bytes=cap)
            _kill_tree_now(proc.pid)  # the exchange then reads EOF and raises SandboxCrashed
            return
        self._watchdog = asyncio.get_running_loop().call_later(self.config.memory_poll_s, self._watch_memory, proc)

    def _close_lifeline(self) -> None:
        fd, self._lifeline = self._lifeline, None
        if fd is not None:
            os.close(fd)

    async def _stop(self) -> None:
        """SIGKILL the namespace's init, then the process group; return once no process of the tree is left."""
        self._close_lifeline()
        proc, self._proc, self._stream = self._proc, None, None
        if proc is None:
            return
        tree = proctree.process_tree(proc.pid)
        # The leader's child is the pid namespace's init (not in our group under bwrap's --new-session). Kill
        # it first and let the leader reap it and exit: killed together, the init would be orphaned to the
        # host's pid 1, which in some containers never reaps. Its death takes the whole namespace with it.
        for pid, (ppid, _) in tree.items():
            if ppid == proc.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), _LEADER_EXIT_S)
        if proc.returncode is None:  # once reaped, its pid (our pgid) may belong to someone else
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left in the group, the leader included
            await proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()
        # Read what the dead checker left in its stdout pipe (bounded by the pipe's capacity): a transport
        # paused on unread output (an oversized response) would otherwise never close.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.stdout.read(), 1.0)
        if self._status_transport is not None:
            self._status_transport.close()
            self._status_transport = None
        stderr_task, self._stderr_task = self._stderr_task, None
        if stderr_task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stderr_task, 1.0)
        await proctree.wait_gone(tree, _GONE_TIMEOUT_S)

    async def _replace(self) -> None:
        """Kill the checker and start the next one now, not on the next request: then stats().starts already
        names the process the next request reaches (callers key REPL env ids on it), and the next request
        does not wait for a start."""
        await self._stop()
        try:
            await self.start()
        except SandboxUnavailable as e:
            # Not the outcome of the request that got us here; the next request retries and raises it.
            log.error("sandbox_restart_failed", sandbox=self.sandbox_id, error=str(e))

    def _argv(self, status_fd: int, lifeline_fd: int) -> tuple[str, list[str]]:
        """(isolation tool, full argv). Blocking (the first call probes the tools), so run in a thread."""
        try:
            return self._build_argv(status_fd, lifeline_fd)
        except OSError as e:  # the state dir, a lock file: the host's setup, not the proof's
            raise SandboxUnavailable(f"cannot prepare the sandbox: {e}") from e

    def _build_argv(self, status_fd: int, lifeline_fd: int) -> tuple[str, list[str]]:
        uid = self._sandbox_uid()
        tool, path = self._isolation_tool(uid)
        cgroup = self._memory_cgroup()
        procs_file = cgroup.procs_file if cgroup is not None else None
        return tool, launch_argv(self.config, tool, path, uid, procs_file, status_fd, lifeline_fd)

    def _memory_cgroup(self) -> memcg.MemoryCgroup | None:
        """This sandbox's memory cgroup, made on the first call where the host allows; None otherwise."""
        cap = self.config.memory_limit_bytes
        if self._cgroup is None and cap is not None and self.config.memory_cgroup == "auto":
            try:
                self._cgroup = memcg.create(f"proofstream-{os.getpid()}-{self.sandbox_id}", cap)
            except OSError as e:  # the watchdog still caps the tree
                log.warning("sandbox_memory_cgroup_failed", sandbox=self.sandbox_id, error=str(e))
        return self._cgroup

    def _sandbox_uid(self) -> int | None:
        """The host uid to drop to (None: stay the worker's). Blocking: leases a uid on the first call."""
        if self.config.uid is not None:
            return self.config.uid
        if os.geteuid() != 0:
            return None
        if self._uid_lease is None:
            lock_dir = os.path.join(self.config.state_dir, "sandbox-uids")
            self._uid_lease = sandbox_uids.lease(lock_dir, self.config.uid_base, self.config.uid_count)
        return self._uid_lease.uid

    def _isolation_tool(self, uid: int | None) -> tuple[str, str]:
        """The first tool of `isolation` that works when run as `uid`, the sandbox's (process_argv.probe)."""
        wanted = ISOLATION_TOOLS if self.config.isolation == "auto" else (self.config.isolation,)
        reasons = []
        for tool in wanted:
            why = probe(tool, uid)
            if why is None:
                return tool, shutil.which(tool) or tool
            reasons.append(why)
        raise SandboxUnavailable(f"no working isolation tool ({'; '.join(reasons)}): {_INSTALL_HINT}")

    async def _spawn(self, argv: list[str], status_fd: int, lifeline_fd: int) -> asyncio.subprocess.Process:
        # From the event loop's thread: PDEATHSIG fires when the spawning *thread* exits, and this one lives
        # as long as the worker (a to_thread pool thread may be retired while the sandbox runs).
        try:
            return await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=checker_env(self.config),
                start_new_session=True,  # its own group, so killpg reaches every process that stayed in it
                pass_fds=(status_fd, lifeline_fd),
            )
        except OSError as e:
            raise SandboxUnavailable(f"cannot spawn the sandbox {argv[0]}: {e}") from e

    async def _read_status(self, fd: int) -> bytes:
        """The first line the sandbox writes on its status pipe (bwrap's JSON, or "ready"), b"" on failure."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        # Kept open until kill(): bwrap writes the exit code there later and dies of SIGPIPE if nobody reads,
        # which would hide the checker's own exit status.
        self._status_transport = transport
        try:
            return await asyncio.wait_for(reader.readline(), self.config.start_timeout_s)
        except TimeoutError:
            return b""

    async def _exit_status(self, wait_s: float) -> str | None:
        proc = self._proc
        if proc is None:
            return None
        if wait_s > 0 and self._stderr_task is not None:
            await asyncio.wait([asyncio.ensure_future(proc.wait()), self._stderr_task], timeout=wait_s)
        return "still running" if proc.returncode is None else f"exit status {proc.returncode}"


async def _drain_stderr(stream: asyncio.StreamReader, tail: StderrTail) -> None:
    while chunk := await stream.read(65536):
        tail.feed(chunk)


def _take_inside(pid: int, path: str, max_bytes: int) -> bytes:
    """Read and unlink `path` (/tmp/NAME) as process `pid` sees it, no component below its root followed
    if a link. Removed whatever it holds: a file left behind could be served to a later check."""
    directory, name = os.path.split(path)
    if directory != "/tmp" or not name or name in (".", ".."):
        raise ValueError(f"only a file directly under /tmp can be read, not {path!r}")
    nofollow = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    dir_fd = os.open(f"/proc/{pid}/root/tmp", nofollow | os.O_DIRECTORY)
    try:
        fd = os.open(name, nofollow | os.O_NONBLOCK, dir_fd=dir_fd)
        os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path} holds more than {max_bytes} bytes")
    return data


def _kill_tree_now(leader: int) -> None:
    """SIGKILL every process of the tree at once (the watchdog's stop; _stop then reaps and waits)."""
    for pid in proctree.tree_pids(leader)[1:]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
