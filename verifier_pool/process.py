"""The `process` sandbox backend: a checker (the Lean REPL, the Countdown checker) run under bubblewrap, or
under util-linux's `unshare` where bwrap is missing, for machines without Docker.

What every sandbox gets:
- rlimits through `prlimit` (inherited across exec and fork, so they bind the checker and its children;
  each applies per process): RLIMIT_AS (address space), RLIMIT_CPU (CPU seconds over the process's
  lifetime, a backstop: the per-request limit is the wall-clock timeout), RLIMIT_FSIZE (largest file
  written), RLIMIT_NPROC (processes of the uid, host-wide; binds a non-root uid only).
- its own session and process group; kill() SIGKILLs the namespace's init and the group, then waits until
  every process of the tree is gone. The pid namespace makes that complete: when its init dies the kernel
  kills everything in it, including processes that called setsid() to leave our group.
- a clean environment (PATH, HOME=/tmp, LANG=C.UTF-8 plus `env`): the worker's secrets never reach it.
- its stderr drained continuously (a full pipe would block the checker); the last few KB go into
  SandboxCrashed messages.
- replacement: right after a timeout or crash, after `max_requests` answers, or once the tree's resident
  memory passed `max_memory_bytes` (Lean REPLs grow), the checker is killed and the next one started at
  once, so that `stats().starts` changes before the next request (callers key REPL env ids on it). A
  sandbox that died between requests, or whose restart failed, is started on the next request.

bwrap (the argv is `bwrap_argv` below): new user, pid, network (nothing but its own loopback), ipc, uts
and cgroup namespaces, no nested user namespaces (--disable-userns where supported), all capabilities
dropped, a new session, killed with its parent. The root is an empty tmpfs, remounted read-only, holding
read-only binds of /usr, the /bin /sbin /lib* symlinks or dirs, a few /etc files for the dynamic linker,
and `ro_paths` (+ `workdir`); a fresh /proc remounted read-only (so /proc/sys and /proc/sysrq-trigger
cannot be written even by host uid 0), a minimal /dev, and a private size-limited tmpfs /tmp, the only
writable place.

unshare (fallback): new user (mapped to root), pid, network (loopback down), ipc, uts and mount namespaces;
a setup script mounts a private size-limited tmpfs on /tmp and a minimal /dev, remounts every other mount
read-only, caps nested user namespaces at the one it then enters to lock those mounts and drop
capabilities before exec'ing the checker. Unlike bwrap it shows the whole host filesystem (read-only):
`ro_paths` are not needed, and paths under /tmp are hidden by the private /tmp, so they are refused.

What it does NOT protect against:
- kernel bugs: no seccomp filter, every syscall is reachable, and user namespaces widen that surface.
- a worker running as root without `uid`: the checker stays uid 0 on the host (user namespaces remap the
  name, not the owner checks), so it can read every root-only file in view (under unshare: the whole
  host), RLIMIT_NPROC does not bind (the kernel exempts root) and a fork bomb is limited only by the
  host's pid_max. Set `uid` (e.g. 65534) whenever the worker runs as root; then `ro_paths` must be
  readable by that uid (not under /root), and RLIMIT_NPROC counts every process of that uid on the host.
- memory as a whole: RLIMIT_AS caps each process's address space, not their sum, and no cgroup memory limit
  is applied (none is available here); the recycle threshold is checked between requests only.
- CPU share: RLIMIT_CPU is a lifetime total, not a quota; a busy checker competes with its neighbours until
  its wall-clock timeout.
- reading what is in view: everything bound (under bwrap) or everything (under unshare) that the uid can
  read; side channels (timing, /proc/cpuinfo); the pdeathsig of --die-with-parent follows the thread that
  spawned the sandbox, so spawn from the event loop's long-lived thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from verifier_pool.repl import DEFAULT_MAX_RESPONSE_BYTES, ReplStream
from verifier_pool.sandbox import SandboxCrashed, SandboxStats, SandboxTimeout, SandboxUnavailable

log = structlog.get_logger("verifier_pool.process")

ISOLATION_TOOLS = ("bwrap", "unshare")  # preference order
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What the dynamic linker and a toolchain's wrapper scripts read; no secrets (no shadow, no ssl keys).
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
)
_BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
_INSTALL_HINT = (
    "install bubblewrap (`apt-get install -y bubblewrap`), or util-linux's unshare with unprivileged user "
    "namespaces enabled (sysctl user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1 on older "
    "Debian; kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap on Ubuntu >= 23.10)"
)
_GONE_TIMEOUT_S = 2.0  # kill() waits this long for the tree to vanish; SIGKILL'd processes exit in ms
_EXIT_GRACE_S = 1.0  # after EOF on stdout, how long a crash gets to finish writing stderr and exit
_LEADER_EXIT_S = 0.5  # bwrap/unshare exit within ms of their child's death

# Runs as root of the new user namespace, before the checker: $1 workdir, $2 /tmp size, $3 status fd,
# $4 unshare binary, then the checker's argv. Any failure exits before "ready", so start() reports it.
_UNSHARE_SETUP = r"""
set -eu
workdir=$1 tmp_bytes=$2 status_fd=$3 unshare_bin=$4
shift 4
# The checker may enter exactly one more user namespace: the one below that locks the mounts.
echo 1 > /proc/sys/user/max_user_namespaces
mount -t tmpfs -o "size=$tmp_bytes,mode=1777,nosuid,nodev" tmpfs /tmp
# A minimal /dev: the host's device nodes would be the checker's to open if it is uid 0 on the host.
mkdir /tmp/.dev
for d in null zero full random urandom; do
  touch "/tmp/.dev/$d"; mount --bind "/dev/$d" "/tmp/.dev/$d"
done
mount -t tmpfs -o mode=755,nosuid tmpfs /dev
for d in null zero full random urandom; do
  touch "/dev/$d"; mount --bind "/tmp/.dev/$d" "/dev/$d"; umount "/tmp/.dev/$d"
done
rm -rf /tmp/.dev
ln -s /proc/self/fd /dev/fd
awk '{print $5}' /proc/self/mountinfo | while read -r mp; do
  mp=$(printf '%b' "$mp")
  [ "$mp" = /tmp ] && continue
  if ! mount -o remount,bind,ro "$mp" 2>/dev/null && [ -e "$mp" ]; then
    echo "proofstream sandbox: cannot make $mp read-only" >&2; exit 1
  fi
done
cd "$workdir"
eval "echo ready >&$status_fd; exec $status_fd>&-"
exec "$unshare_bin" --user --mount -- "$@"
"""


@dataclass(frozen=True, slots=True)
class ProcessSandboxConfig:
    argv: tuple[str, ...]  # the checker, e.g. ("lake", "env", "repl"); argv[0] resolved on `env`'s PATH
    ro_paths: tuple[str, ...] = ()  # bound read-only (bwrap): the Lean toolchain, the Python prefix, ...
    workdir: str = "/tmp"  # the checker's cwd (the Lean project); bound read-only unless under /tmp
    env: Mapping[str, str] = field(default_factory=dict)  # added to PATH, HOME=/tmp, LANG=C.UTF-8
    memory_limit_bytes: int | None = 8 << 30  # RLIMIT_AS; kimina's image uses 8 GB for Mathlib
    cpu_limit_s: int | None = 3600  # RLIMIT_CPU per process over its lifetime, a backstop
    fsize_limit_bytes: int | None = 64 << 20  # RLIMIT_FSIZE
    nproc_limit: int | None = 512  # RLIMIT_NPROC: all processes of the uid host-wide; ignored for root (`uid`)
    tmp_bytes: int = 256 << 20  # size of the private /tmp (it is memory)
    uid: int | None = None  # run as this host uid (the worker must be root); None: the worker's own
    gid: int | None = None  # defaults to uid
    max_requests: int | None = None  # recycle after this many answers; None: never
    max_memory_bytes: int | None = None  # recycle once the tree's resident memory exceeds this
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    start_timeout_s: float = 10.0
    stderr_tail_bytes: int = 4096
    isolation: str = "auto"  # "auto" (bwrap, else unshare), "bwrap" or "unshare"

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("argv is empty: give the checker command, e.g. ('lake', 'env', 'repl')")
        if self.isolation not in ("auto", *ISOLATION_TOOLS):
            raise ValueError(f"isolation must be auto, bwrap or unshare, not {self.isolation!r}")
        for path in (*self.ro_paths, self.workdir):
            if not os.path.isabs(path):
                raise ValueError(f"sandbox paths must be absolute: {path!r}")
        for name in ("memory_limit_bytes", "cpu_limit_s", "fsize_limit_bytes", "nproc_limit", "max_requests"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None, not {value}")


def available() -> str | None:
    """The isolation tool that works on this machine ("bwrap" or "unshare"), or None."""
    return next((tool for tool in ISOLATION_TOOLS if _probe(tool) is None), None)


@functools.cache
def _probe(tool: str) -> str | None:
    """None if `tool` can build a sandbox here, else why not. Installed is not enough: user namespaces may
    be disabled (sysctl, AppArmor), so actually run `true` in one."""
    path = shutil.which(tool)
    if path is None:
        return f"{tool} not found on PATH"
    if tool == "bwrap":
        argv = [path, "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/", "true"]
    else:
        argv = [path, "--user", "--map-root-user", "--net", "--pid", "--fork", "--mount", "--mount-proc", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{tool} failed to run: {e}"
    if done.returncode != 0:
        return f"{tool} exited {done.returncode}: {done.stderr.decode(errors='replace').strip()[-300:]}"
    return None


@functools.cache
def _bwrap_supports(bwrap: str, option: str) -> bool:
    # --disable-userns and --size came with bwrap 0.8 / 0.5; older distributions ship older ones.
    help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, check=False).stdout
    return option in help_text


def _check_paths(config: ProcessSandboxConfig) -> None:
    missing = [p for p in (*config.ro_paths, config.workdir) if not os.path.exists(p)]
    if missing:
        raise SandboxUnavailable(f"sandbox paths missing on this machine: {missing}")


def _bind_paths(config: ProcessSandboxConfig) -> list[str]:
    _check_paths(config)
    paths = list(config.ro_paths)
    if not _under(config.workdir, ["/tmp", *paths]):
        paths.append(config.workdir)
    return paths


def bwrap_argv(bwrap: str, config: ProcessSandboxConfig, status_fd: int) -> list[str]:
    argv = [bwrap, "--unshare-all", "--unshare-user", "--cap-drop", "ALL", "--new-session", "--die-with-parent"]
    if _bwrap_supports(bwrap, "--disable-userns"):
        argv.append("--disable-userns")
    argv += ["--json-status-fd", str(status_fd), "--proc", "/proc", "--dev", "/dev"]
    if _bwrap_supports(bwrap, "--size"):
        argv += ["--size", str(config.tmp_bytes)]
    argv += ["--tmpfs", "/tmp"]  # before the binds, so that paths under /tmp can be bound on top of it
    for top in _SYSTEM_DIRS:
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for path in _ETC_FILES:
        argv += ["--ro-bind-try", path, path]
    binds = _bind_paths(config)
    for path in binds:
        argv += ["--ro-bind", path, path]
    # The root is a tmpfs (writable, unbounded) until remounted; /proc/sys would be writable to a checker that
    # is uid 0 on the host.
    argv += ["--remount-ro", "/proc", "--remount-ro", "/", "--chdir", config.workdir, "--"]
    checker = _resolve_argv(config)
    visible = [*_SYSTEM_DIRS, *(os.path.realpath(d) for d in _SYSTEM_DIRS), *binds]
    for path in (checker[0], os.path.realpath(checker[0])):
        if not _under(path, visible):
            raise SandboxUnavailable(f"checker {path} is not inside the sandbox: add its directory to ro_paths")
    return argv + checker


def _under(path: str, roots: list[str] | tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def unshare_argv(unshare: str, config: ProcessSandboxConfig, status_fd: int) -> list[str]:
    _check_paths(config)
    hidden = [p for p in (*config.ro_paths, config.workdir, config.argv[0]) if _under(p, ["/tmp"]) and p != "/tmp"]
    if hidden:
        raise SandboxUnavailable(f"{hidden} under /tmp, which the unshare sandbox replaces: use bwrap or move them")
    argv = []
    setpriv = shutil.which("setpriv")
    if setpriv:  # unshare has no --die-with-parent: take the sandbox down if the worker dies
        argv += [setpriv, "--pdeathsig", "KILL", "--"]
    argv += [unshare, "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount"]
    argv += ["--mount-proc", "--ipc", "--uts", "--", "/bin/bash", "-c", _UNSHARE_SETUP, "proofstream-sandbox"]
    argv += [config.workdir, str(config.tmp_bytes), str(status_fd), unshare]
    return argv + _resolve_argv(config)


def _resolve_argv(config: ProcessSandboxConfig) -> list[str]:
    """argv with argv[0] made absolute: a missing checker must fail start(), not crash every request (which
    the caller would blame on the proofs)."""
    env_path = _checker_env(config)["PATH"]
    program = config.argv[0] if os.path.isabs(config.argv[0]) else shutil.which(config.argv[0], path=env_path)
    if program is None or not os.access(program, os.X_OK):
        raise SandboxUnavailable(f"checker {config.argv[0]!r} not found or not executable (PATH={env_path})")
    return [program, *config.argv[1:]]


def _checker_env(config: ProcessSandboxConfig) -> dict[str, str]:
    return {**_BASE_ENV, **config.env}


def rlimit_argv(prlimit: str, config: ProcessSandboxConfig) -> list[str]:
    argv = [prlimit]
    limits = {
        "as": config.memory_limit_bytes,
        "cpu": config.cpu_limit_s,
        "fsize": config.fsize_limit_bytes,
        "nproc": config.nproc_limit,
    }
    argv += [f"--{name}={value}" for name, value in limits.items() if value is not None]
    return [*argv, "--"]


class ProcessSandbox:
    """One checker under bwrap/unshare; the Sandbox protocol of verifier_pool.sandbox."""

    backend = "process"

    def __init__(self, config: ProcessSandboxConfig, sandbox_id: str | None = None) -> None:
        self.config = config
        self.sandbox_id = sandbox_id or f"process-{uuid.uuid4().hex[:8]}"
        self._stats = SandboxStats(sandbox_id=self.sandbox_id, backend=self.backend)
        self._proc: asyncio.subprocess.Process | None = None
        self._stream: ReplStream | None = None
        self._stderr_tail = bytearray()
        self._stderr_task: asyncio.Task | None = None
        self._in_flight = False  # still True after an exchange that never finished (cancelled): out of step
        self._status_transport: asyncio.ReadTransport | None = None

    # -- the Sandbox protocol --------------------------------------------------------------------------

    async def start(self) -> None:
        """(Re)start the checker; returns once the sandbox is set up. SandboxUnavailable if it cannot be."""
        await self.kill()
        status_read, status_write = os.pipe()
        try:
            tool, argv = await asyncio.to_thread(self._argv, status_write)
            started = time.monotonic()
            self._proc = await self._spawn(argv, status_write)
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)  # the sandbox holds its own copy; EOF on ours means it gave up
        self._stderr_tail = bytearray()
        self._stderr_task = asyncio.create_task(self._drain_stderr(self._proc.stderr))
        self._stream = ReplStream(
            self._proc.stdout, self._proc.stdin, max_response_bytes=self.config.max_response_bytes
        )
        status = await self._read_status(status_read)
        if not status:
            detail = await self._exit_detail(wait_s=_EXIT_GRACE_S)
            await self.kill()
            raise SandboxUnavailable(f"{tool} could not set up the sandbox ({detail})")
        if self._stats.starts == 0 and os.geteuid() == 0 and self.config.uid is None:
            log.warning("sandbox_checker_is_host_root", sandbox=self.sandbox_id, hint="set uid, e.g. 65534")
        self._in_flight = False
        self._stats.requests = 0
        self._stats.starts += 1
        self._stats.extra["isolation"] = tool
        log.info("sandbox_started", sandbox=self.sandbox_id, isolation=tool, start_ms=_ms_since(started))

    async def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self._needs_restart():  # not started yet, an exchange cut off by cancellation, a failed restart
            await self.start()
        assert self._stream is not None and self._proc is not None
        self._in_flight = True
        try:
            response = await self._stream.exchange(payload, timeout_s)
        except ValueError:
            self._in_flight = False  # refused before anything was sent: the checker is still in step
            raise
        except SandboxTimeout:
            self._stats.timeouts += 1
            log.warning("sandbox_timeout", sandbox=self.sandbox_id, timeout_s=timeout_s)
            await self._replace()
            raise
        except SandboxCrashed as e:
            self._stats.crashes += 1
            detail = await self._exit_detail(wait_s=_EXIT_GRACE_S if self._proc.stdout.at_eof() else 0)
            log.warning("sandbox_crashed", sandbox=self.sandbox_id, error=str(e), detail=detail)
            await self._replace()
            raise SandboxCrashed(f"{e} ({detail})") from e
        self._in_flight = False
        self._stats.requests += 1
        self._stats.total_requests += 1
        if self._recycle_due():
            await self._replace()
        return response

    async def kill(self) -> None:
        """SIGKILL the namespace's init, then the process group; return once no process of the tree is left."""
        proc, self._proc, self._stream = self._proc, None, None
        if proc is None:
            return
        tree = _process_tree(proc.pid)
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
        await _wait_gone(tree, _GONE_TIMEOUT_S)

    async def memory_bytes(self) -> int | None:
        if self._proc is None or self._proc.returncode is not None:
            return None
        rss = _tree_rss_bytes(self._proc.pid)
        self._stats.memory_bytes = rss
        return rss

    def stats(self) -> SandboxStats:
        return dataclasses.replace(self._stats, extra=dict(self._stats.extra))

    # -- internals ---------------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The sandbox's leader (bwrap/unshare): its pid is also the process group id. None if not running."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    @property
    def stderr_tail(self) -> str:
        return self._stderr_tail.decode("utf-8", "replace")

    def _needs_restart(self) -> bool:
        return self._proc is None or self._proc.returncode is not None or self._in_flight

    def _recycle_due(self) -> bool:
        max_requests = self.config.max_requests
        if max_requests is not None and self._stats.requests >= max_requests:
            log.info("sandbox_recycle", sandbox=self.sandbox_id, reason="requests", requests=self._stats.requests)
            return True
        if self.config.max_memory_bytes is not None:
            rss = _tree_rss_bytes(self._proc.pid)
            self._stats.memory_bytes = rss
            if rss > self.config.max_memory_bytes:
                log.info("sandbox_recycle", sandbox=self.sandbox_id, reason="memory", memory_bytes=rss)
                return True
        return False

    async def _replace(self) -> None:
        """Kill the checker and start the next one now, not on the next request: then stats().starts already
        names the process the next request reaches (callers key REPL env ids on it), and the next request
        does not wait for a start."""
        await self.kill()
        try:
            await self.start()
        except SandboxUnavailable as e:
            # Not the outcome of the request that got us here; the next request retries and raises it.
            log.error("sandbox_restart_failed", sandbox=self.sandbox_id, error=str(e))

    def _argv(self, status_fd: int) -> tuple[str, list[str]]:
        """(isolation tool, full argv). Blocking (the first call probes the tools), so run in a thread."""
        tool, path = self._isolation_tool()
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise SandboxUnavailable("prlimit not found: install util-linux")
        build = bwrap_argv if tool == "bwrap" else unshare_argv
        return tool, rlimit_argv(prlimit, self.config) + build(path, self.config, status_fd)

    def _isolation_tool(self) -> tuple[str, str]:
        wanted = ISOLATION_TOOLS if self.config.isolation == "auto" else (self.config.isolation,)
        reasons = []
        for tool in wanted:
            why = _probe(tool)
            if why is None:
                return tool, shutil.which(tool) or tool
            reasons.append(why)
        raise SandboxUnavailable(f"no working isolation tool ({'; '.join(reasons)}): {_INSTALL_HINT}")

    async def _spawn(self, argv: list[str], status_fd: int) -> asyncio.subprocess.Process:
        uid = self.config.uid
        gid = self.config.gid if self.config.gid is not None else uid
        try:
            return await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=_checker_env(self.config),
                start_new_session=True,  # its own group, so killpg reaches every process that stayed in it
                pass_fds=(status_fd,),
                user=uid,
                group=gid,
                extra_groups=[] if uid is not None else None,  # drop root's supplementary groups too
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

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        keep = self.config.stderr_tail_bytes
        while chunk := await stream.read(65536):
            self._stderr_tail += chunk
            del self._stderr_tail[:-keep]

    async def _exit_detail(self, wait_s: float) -> str:
        """Exit status and stderr tail, for the error message. A crashing checker is given `wait_s` to exit
        and finish its stderr (the interesting line, e.g. `Stack overflow detected`, comes last)."""
        proc = self._proc
        if proc is None:
            return "not running"
        if wait_s > 0 and self._stderr_task is not None:
            await asyncio.wait([asyncio.ensure_future(proc.wait()), self._stderr_task], timeout=wait_s)
        status = "still running" if proc.returncode is None else f"exit status {proc.returncode}"
        return f"{status}; stderr tail: {self.stderr_tail[-1000:]!r}"


def _ms_since(started: float) -> int:
    return round((time.monotonic() - started) * 1000)


def _read_stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) from /proc/<pid>/stat, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may contain spaces and parentheses
    return int(fields[1]), fields[0].decode(), int(fields[19])


def _process_tree(root: int) -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time)} of `root` and all its descendants. Orphans inside the pid namespace
    are re-parented to its init, itself a descendant, so nothing in the namespace escapes this walk."""
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _read_stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
            stats[int(entry)] = (stat[0], stat[2])
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats and pid not in tree:
            tree[pid] = stats[pid]
            todo += children.get(pid, [])
    return tree


def _alive(pid: int, start_time: int) -> bool:
    stat = _read_stat(pid)
    return stat is not None and stat[2] == start_time and stat[1] != "Z"  # same process, not yet a zombie


async def _wait_gone(tree: dict[int, tuple[int, int]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(_alive(pid, start) for pid, (_, start) in tree.items()):
        if time.monotonic() > deadline:
            left = [pid for pid, (_, start) in tree.items() if _alive(pid, start)]
            # The infrastructure's fault (a process stuck in the kernel), not the proof's.
            raise SandboxUnavailable(f"processes {left} survived SIGKILL for {timeout_s} s")
        await asyncio.sleep(0.01)


def _tree_rss_bytes(root: int) -> int:
    total_kib = 0
    for pid in _process_tree(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                total_kib += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        except OSError:
            continue  # exited while we were summing
    return total_kib * 1024
