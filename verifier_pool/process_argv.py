"""How a process sandbox is launched (verifier_pool.process runs it): the private root it shows, the argv
of bwrap or unshare that builds it, and the small shell programs of the launch chain.

The chain, first to last, each exec'ing the next in the same process (the sandbox's leader): `ENTER` of
verifier_pool.memcg (where a memory cgroup is made) -> `STAGE` (root workers, for paths the sandbox's uid
cannot reach) -> `setpriv` (the uid drop, then PDEATHSIG) -> `GUARD` -> `unshare --pid --kill-child` (bwrap
only) -> `prlimit` -> bwrap or unshare (+ `UNSHARE_SETUP`) -> inside: `LIFELINE` -> the checker.
`launch_argv` puts it together.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass

from verifier_pool.memcg import ENTER
from verifier_pool.sandbox import SandboxUnavailable
from verifier_pool.sandbox_config import ProcessSandboxConfig

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

# The first programs of every sandbox's chain, after `setpriv --pdeathsig KILL`: $1 is the worker's pid. A
# worker killed between fork and setpriv's prctl left the chain orphaned with no death signal; then the
# parent is no longer the worker, and the chain stops here.
GUARD = r"""
[ "$PPID" = "$1" ] || { echo "proofstream sandbox: the worker ($1) died during start" >&2; exit 1; }
shift
exec "$@"
"""

# Wraps the checker inside the sandbox: $1 is the read end of a pipe whose only write end the worker holds.
# A watcher sees end of file once the worker is gone, however it went, and kills every process of the
# sandbox it may signal. It starts after the checker, so no checker can be started after its kill. The
# checker runs as a child (not exec'd): under unshare this shell is the pid namespace's init, which a
# signal from inside cannot kill, so it must be the shell, not the checker, that the namespace hangs on.
LIFELINE = r"""
fd=$1
shift
(eval "exec $fd<&-"; exec "$@") <&0 &
checker=$!
(eval "cat <&$fd"; kill -s KILL -1) </dev/null >/dev/null 2>&1 &
eval "exec $fd<&-"
wait "$checker"
"""

# Runs as host root in a private mount namespace (unshare --mount), before dropping to the sandbox's uid:
# binds what that uid cannot reach (under /root, mode 0700) onto $1/<i>, a tmpfs only this namespace sees,
# so the sandbox tool, running as the uid, binds them from there. $2 is the count, then the sources.
STAGE = r"""
set -eu
stage=$1 n=$2
shift 2
mount -t tmpfs -o size=64k,mode=755,nosuid,nodev proofstream-stage "$stage"
i=0
while [ "$i" -lt "$n" ]; do
  if [ -d "$1" ]; then mkdir "$stage/$i"; else touch "$stage/$i"; fi
  mount --bind "$1" "$stage/$i"
  mount -o remount,bind,ro "$stage/$i"
  i=$((i + 1))
  shift
done
exec "$@"
"""

# Runs as root of the new user namespace (unshare --user --map-root-user --mount --pid --fork), before
# the checker, and builds the private root bwrap builds: $1 workdir, $2 /tmp size, $3 status fd, $4 the
# unshare binary, $5 where to build the root (a host directory no bound path lies under: `_root_mount`), $6
# the count of binds, then "SOURCE DEST" pairs, then "TARGET LINK" symlink pairs after a count, then the
# checker's argv. The sandbox's /tmp is mounted before the binds, so a path under it can be bound too (a
# checkout under /tmp). Any failure exits before "ready", so start() reports it.
UNSHARE_SETUP = r"""
set -eu
workdir=$1 tmp_bytes=$2 status_fd=$3 unshare_bin=$4 new=$5 n=$6
shift 6
checker_path=$PATH
PATH=/usr/sbin:/sbin:$PATH  # pivot_root
# The checker may enter exactly one more user namespace: the one below that locks the mounts.
echo 1 > /proc/sys/user/max_user_namespaces
# $new is shadowed in this mount namespace only
mount -t tmpfs -o size=1m,mode=755,nosuid,nodev proofstream-root "$new"
mkdir "$new/proc" "$new/dev" "$new/tmp" "$new/.old"
mount -t tmpfs -o "size=$tmp_bytes,mode=1777,nosuid,nodev" tmpfs "$new/tmp"
while [ "$n" -gt 0 ]; do
  src=$1 dest=$new$2
  shift 2
  n=$((n - 1))
  if [ -d "$src" ]; then mkdir -p "$dest"; else mkdir -p "${dest%/*}"; touch "$dest"; fi
  mount --rbind "$src" "$dest"
done
n=$1
shift
while [ "$n" -gt 0 ]; do
  mkdir -p "$(dirname "$new$2")"
  ln -s "$1" "$new$2"
  shift 2
  n=$((n - 1))
done
mount -t proc -o nosuid,nodev,noexec proc "$new/proc"
# A minimal /dev: device nodes bound one by one onto a tmpfs that is then made read-only.
mount -t tmpfs -o size=64k,mode=755,nosuid proofstream-dev "$new/dev"
for d in null zero full random urandom; do
  touch "$new/dev/$d"; mount --bind "/dev/$d" "$new/dev/$d"
done
ln -s /proc/self/fd "$new/dev/fd"
cd "$new"
pivot_root . .old
umount -l /.old
rmdir /.old
# Everything read-only but /tmp and the device nodes (a read-only mount refuses opening them for writing).
awk '{print $5}' /proc/self/mountinfo | while read -r mp; do
  mp=$(printf '%b' "$mp")
  case $mp in /tmp|/dev/null|/dev/zero|/dev/full|/dev/random|/dev/urandom) continue ;; esac
  mount -o remount,bind,ro "$mp" 2>/dev/null || {
    echo "proofstream sandbox: cannot make $mp read-only" >&2; exit 1; }
done
cd "$workdir"
PATH=$checker_path
eval "echo ready >&$status_fd; exec $status_fd>&-"
exec "$unshare_bin" --user --mount -- "$@"
"""


def launch_argv(
    config: ProcessSandboxConfig,
    tool: str,
    tool_path: str,
    uid: int | None,
    cgroup_procs: str | None,
    status_fd: int,
    lifeline_fd: int,
) -> list[str]:
    """The whole chain (the module's docstring), ending in the checker. `tool` ("bwrap" or "unshare", at
    `tool_path`) builds the sandbox; `uid`: the host uid to drop to (None: stay the worker's); `cgroup_procs`:
    the cgroup.procs file of the sandbox's memory cgroup, if it has one. Blocking (it may probe unshare, and
    make the staging directory)."""
    tools = {name: shutil.which(name) for name in ("prlimit", "setpriv", "unshare")}
    missing = [name for name, found in tools.items() if found is None]
    if missing:
        raise SandboxUnavailable(f"{', '.join(missing)} not found: install util-linux")
    root = private_root(config)
    chain: list[str] = []
    if cgroup_procs is not None:  # first, so that every process of the chain is born inside
        chain += ["/bin/sh", "-c", ENTER, "proofstream-cgroup", cgroup_procs]
    if uid is not None:
        # Sources the uid cannot reach are bound from root's side first (bwrap and unshare open them as
        # the uid); permissions on the host stay as they are.
        hidden = [src for src, _ in root.binds if not reachable_by_others(src)]
        if hidden:
            stage = os.path.join(config.state_dir, "stage")
            _ensure_dir(stage, 0o755)
            chain += [tools["unshare"], "--mount", "--propagation", "private", "--", "/bin/sh", "-c", STAGE]
            chain += ["proofstream-stage", stage, str(len(hidden)), *hidden]
            root = root.staged(stage, hidden)
        gid = config.gid if config.gid is not None else uid
        chain += [tools["setpriv"], f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    else:
        chain += [tools["setpriv"]]
    # PDEATHSIG is set after the uid change (which clears it), and the guard closes the fork-to-prctl gap.
    chain += ["--pdeathsig", "KILL", "--", "/bin/sh", "-c", GUARD, "proofstream-guard", str(os.getpid())]
    build = bwrap_argv if tool == "bwrap" else unshare_argv
    if tool == "bwrap" and probe("unshare", uid) is None:
        # bwrap's inner process sets its death signal only after its setup, and one orphaned before
        # that waits forever for its dead parent (an eventfd): the bwrap a SIGKILLed worker left
        # running. Under a pid namespace whose init dies with us (unshare's --kill-child), the kernel
        # takes it down with the rest. unshare's flow has that init already. Where unshare may not make
        # user namespaces (AppArmor allowing bwrap alone) this is skipped: the lifeline still ends a
        # checker, but a bwrap orphaned mid-setup may stay, idle.
        # --mount-proc: bwrap reads /proc/<its pid>/ns, and a /proc of the outer pid namespace names
        # another process (in a container as uid 10001: "open /proc/2/ns/ns failed"; tests/deploy).
        chain += [tools["unshare"], "--user", "--map-current-user", "--pid", "--fork", "--kill-child"]
        chain += ["--mount", "--mount-proc", "--"]
    sandbox = build(tool_path, config, status_fd, root, lifeline_fd)
    return chain + rlimit_argv(tools["prlimit"], config) + sandbox


def _ensure_dir(path: str, mode: int) -> None:
    os.makedirs(path, mode=mode, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SandboxUnavailable(f"{path} must be a directory owned by uid {os.geteuid()}, writable only by it")


@functools.cache
def probe(tool: str, uid: int | None = None) -> str | None:
    """None if `tool` can build a sandbox here, run as `uid` (None: as this process), else why not. Installed
    is not enough: user namespaces may be disabled (sysctl, AppArmor), and the sandbox's uid may be unable to
    execute the tool (a bwrap under /root, mode 0700, which root's own probe ran fine), so actually run `true`
    in one, as the uid the sandbox will run as."""
    path = shutil.which(tool)
    if path is None:
        return f"{tool} not found on PATH"
    if tool == "bwrap":
        argv = [path, "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/", "true"]
    else:
        argv = [path, "--user", "--map-root-user", "--net", "--pid", "--fork", "--mount", "--mount-proc", "true"]
    as_uid = ""
    if uid is not None and uid != os.geteuid():
        setpriv, unshare = shutil.which("setpriv"), shutil.which("unshare")
        if setpriv is None or unshare is None:
            return "setpriv or unshare not found: install util-linux"
        # In a pid namespace of its own (root may always make one), whose end the kernel reaps: bwrap leaves
        # an exited helper to the host's init, which (in a container) may reap it late, and a uid with a
        # process, even a zombie, is one sandbox_uids will not lease.
        # The tool is exec'd by a shell already running as the uid, as in the sandbox's chain (GUARD): exec'd by
        # setpriv itself, a bwrap the uid may not reach ran anyway (util-linux 2.38).
        as_the_uid = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", "/bin/sh", "-c"]
        argv = [unshare, "--pid", "--fork", "--kill-child", "--", *as_the_uid, 'exec "$@"', "proofstream-probe", *argv]
        as_uid = f" (as uid {uid}, the sandbox's)"
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, check=False, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{tool} failed to run{as_uid}: {e}"
    if done.returncode != 0:
        return f"{tool} exited {done.returncode}{as_uid}: {done.stderr.decode(errors='replace').strip()[-300:]}"
    return None


@functools.cache
def bwrap_supports(bwrap: str, option: str) -> bool:
    # --disable-userns and --size came with bwrap 0.8 / 0.5; older distributions ship older ones.
    help_text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, check=False).stdout
    return option in help_text


def _check_paths(config: ProcessSandboxConfig) -> None:
    missing = [p for p in (*config.ro_paths, config.workdir) if not os.path.exists(p)]
    if missing:
        raise SandboxUnavailable(f"sandbox paths missing on this machine: {missing}")


def _bind_paths(config: ProcessSandboxConfig) -> list[str]:
    """`ro_paths`, and the workdir unless it is the sandbox's own /tmp or lies in one of them. A workdir under
    the host's /tmp (a checkout there) is bound like any other: the sandbox's /tmp tmpfs is made first."""
    _check_paths(config)
    paths = list(config.ro_paths)
    if config.workdir != "/tmp" and not _under(config.workdir, paths):
        paths.append(config.workdir)
    return paths


@dataclass(frozen=True, slots=True)
class PrivateRoot:
    """What the sandbox's root holds besides /proc, /dev and /tmp: read-only binds and symlinks."""

    binds: tuple[tuple[str, str], ...]  # (source on the host, destination inside)
    symlinks: tuple[tuple[str, str], ...]  # (target, link)

    def staged(self, stage_dir: str, sources: list[str]) -> PrivateRoot:
        """The same root with `sources` bound from `stage_dir`/<i> (see STAGE)."""
        where = {src: f"{stage_dir}/{i}" for i, src in enumerate(sources)}
        return PrivateRoot(tuple((where.get(s, s), d) for s, d in self.binds), self.symlinks)


def private_root(config: ProcessSandboxConfig) -> PrivateRoot:
    binds, symlinks = [], []
    for top in _SYSTEM_DIRS:
        if os.path.islink(top):
            symlinks.append((os.readlink(top), top))
        elif os.path.isdir(top):
            binds.append((top, top))
    binds += [(path, path) for path in _ETC_FILES if os.path.exists(path)]
    binds += [(path, path) for path in _bind_paths(config)]
    binds += _interpreter_bind(config, binds)
    # Parents before what lies inside them: a bind made later over a parent hides the earlier one below it
    # (unshare's read-only remount of the hidden mount point then fails; bwrap hides it silently).
    binds.sort(key=lambda bind: bind[1].rstrip("/").count("/"))
    return PrivateRoot(tuple(binds), tuple(symlinks))


def _visible(root_binds: list[tuple[str, str]]) -> list[str]:
    """The paths a checker sees in the private root: the system directories (as named and as resolved) and
    what is bound."""
    return [*_SYSTEM_DIRS, *(os.path.realpath(d) for d in _SYSTEM_DIRS), *(d for _, d in root_binds)]


def _interpreter_bind(config: ProcessSandboxConfig, binds: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The checker's program at the path it is named by, where that path is outside the sandbox's view but
    the file it resolves to is inside: a virtual environment's `bin/python` (a symlink to the interpreter it was
    made from, whose prefix is bound). Only that one file is bound, read-only, never its directory: the
    environment's packages stay outside, and the interpreter runs as the one it links to."""
    program = _resolve_argv(config)[0]
    real = os.path.realpath(program)
    visible = _visible(binds)
    if program != real and not _under(program, visible) and _under(real, visible):
        return [(real, program)]
    return []


def bwrap_argv(
    bwrap: str, config: ProcessSandboxConfig, status_fd: int, root: PrivateRoot | None = None, lifeline_fd: int = -1
) -> list[str]:
    root = root or private_root(config)
    argv = [bwrap, "--unshare-all", "--unshare-user", "--cap-drop", "ALL", "--new-session", "--die-with-parent"]
    if bwrap_supports(bwrap, "--disable-userns"):
        argv.append("--disable-userns")
    argv += ["--json-status-fd", str(status_fd), "--proc", "/proc", "--dev", "/dev"]
    if bwrap_supports(bwrap, "--size"):
        argv += ["--size", str(config.tmp_bytes)]
    argv += ["--tmpfs", "/tmp"]  # before the binds, so that paths under /tmp can be bound on top of it
    for target, link in root.symlinks:
        argv += ["--symlink", target, link]
    for source, dest in root.binds:
        argv += ["--ro-bind", source, dest]
    # The root is a tmpfs (writable, unbounded) until remounted, and so is /dev with its /dev/shm; /proc/sys
    # would be writable to a checker that is uid 0 on the host. (The device nodes are binds of their own,
    # which stay writable.)
    argv += ["--remount-ro", "/dev", "--remount-ro", "/proc", "--remount-ro", "/", "--chdir", config.workdir, "--"]
    checker = _resolve_argv(config)
    _check_visible(checker[0], root)
    return argv + _lifeline_argv(lifeline_fd) + checker


def _check_visible(program: str, root: PrivateRoot) -> None:
    visible = _visible(list(root.binds))
    for path in (program, os.path.realpath(program)):
        if not _under(path, visible):
            raise SandboxUnavailable(f"checker {path} is not inside the sandbox: add its directory to ro_paths")


def _lifeline_argv(fd: int) -> list[str]:
    # bash: dash's redirections take single-digit fds only
    return ["/bin/bash", "-c", LIFELINE, "proofstream-lifeline", str(fd)] if fd >= 0 else []


def _under(path: str, roots: list[str] | tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def unshare_argv(
    unshare: str, config: ProcessSandboxConfig, status_fd: int, root: PrivateRoot | None = None, lifeline_fd: int = -1
) -> list[str]:
    root = root or private_root(config)
    checker = _resolve_argv(config)
    _check_visible(checker[0], root)
    argv = [unshare, "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount"]
    argv += ["--mount-proc", "--ipc", "--uts", "--", "/bin/bash", "-c", UNSHARE_SETUP, "proofstream-sandbox"]
    argv += [config.workdir, str(config.tmp_bytes), str(status_fd), unshare, _root_mount(root)]
    argv += [str(len(root.binds)), *(part for bind in root.binds for part in bind)]
    argv += [str(len(root.symlinks)), *(part for link in root.symlinks for part in link)]
    return argv + _lifeline_argv(lifeline_fd) + checker


# Host directories the unshare sandbox may build its root on (a tmpfs mounted there in its own mount namespace
# hides the host's directory from it alone): the first that exists and holds nothing the sandbox binds.
_ROOT_MOUNTS = ("/mnt", "/media", "/srv", "/opt", "/run", "/var", "/tmp", "/home")


def _root_mount(root: PrivateRoot) -> str:
    sources = [os.path.realpath(src) for src, _ in root.binds] + [src for src, _ in root.binds]
    for place in _ROOT_MOUNTS:
        if os.path.isdir(place) and not os.path.islink(place) and not any(_under(s, [place]) for s in sources):
            return place
    why = f"each of {', '.join(_ROOT_MOUNTS)} is missing or holds a bound path; use bwrap"
    raise SandboxUnavailable(f"no host directory to build the unshare sandbox's root on: {why}")


def _resolve_argv(config: ProcessSandboxConfig) -> list[str]:
    """argv with argv[0] made absolute: a missing checker must fail start(), not crash every request (which
    the caller would blame on the proofs)."""
    env_path = checker_env(config)["PATH"]
    program = config.argv[0] if os.path.isabs(config.argv[0]) else shutil.which(config.argv[0], path=env_path)
    if program is None or not os.access(program, os.X_OK):
        raise SandboxUnavailable(f"checker {config.argv[0]!r} not found or not executable (PATH={env_path})")
    return [program, *config.argv[1:]]


def checker_env(config: ProcessSandboxConfig) -> dict[str, str]:
    return {**_BASE_ENV, **config.env}


def rlimit_argv(prlimit: str, config: ProcessSandboxConfig) -> list[str]:
    argv = [prlimit]
    limits = {
        "as": config.memory_limit_bytes,
        "cpu": config.cpu_limit_s,
        "fsize": config.fsize_limit_bytes,
        "nproc": config.pids_limit,
    }
    argv += [f"--{name}={value}" for name, value in limits.items() if value is not None]
    return [*argv, "--"]


def reachable_by_others(path: str) -> bool:
    """Whether a uid with no owner or group rights here can reach and read `path` (every directory above it
    searchable by others, the path itself readable by them)."""
    real = os.path.realpath(path)
    parts = real.split("/")
    try:
        for i in range(1, len(parts)):
            if not os.stat("/".join(parts[:i]) or "/").st_mode & stat.S_IXOTH:
                return False
        return bool(os.stat(real).st_mode & stat.S_IROTH)
    except OSError:
        return False


def checker_digest(config: ProcessSandboxConfig) -> str:
    """What judges, when the checker's handshake names no digest: its binary (path, size, mtime) and argv."""
    program = os.path.realpath(_resolve_argv(config)[0])
    st = os.stat(program)
    described = json.dumps([program, st.st_size, st.st_mtime_ns, list(config.argv)])
    return hashlib.sha256(described.encode()).hexdigest()[:16]
