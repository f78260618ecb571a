"""What a sandbox backend is told: `SandboxConfig` holds the settings the docker and the process backends both
take, each under one name; `DockerSandboxConfig` and `ProcessSandboxConfig` add what only one of them has.
verifier_pool.pool builds them from VerifierSettings (the user's settings); no field here is read from a
settings file or the environment itself.

Where the backends enforce a shared setting differently, its comment says how each does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from verifier_pool import sandbox_uids
from verifier_pool.repl import DEFAULT_MAX_RESPONSE_BYTES, LEAN_HANDSHAKE, Handshake

CHECKER_IMAGE = "proofstream-checker:latest"  # ops/deploy/images/checker/Dockerfile, by ops/deploy/docker_setup.sh

NOBODY = "65534:65534"
ISOLATION_TOOLS = ("bwrap", "unshare")  # the process backend's, in order of preference


@dataclass(frozen=True, kw_only=True)
class SandboxConfig:
    # The checker's command. docker: run in the image, which has no ENTRYPOINT; process: argv[0] is resolved on
    # `env`'s PATH.
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # added to HOME=/tmp, LANG=C.UTF-8 (process: and PATH)
    # The checker's memory cap (kimina's image uses 8 GB for Mathlib). docker: the container's cgroup limit, swap
    # included. process: RLIMIT_AS per process, and the whole tree's cap (resident memory + private /tmp, polled).
    memory_limit_bytes: int | None = 8 << 30
    # Processes + threads (Lean's task manager runs a thread per core). docker: the container's pids limit.
    # process: RLIMIT_NPROC, which counts every process of the sandbox's uid (its own when the worker is root).
    pids_limit: int | None = 512
    tmp_bytes: int = 256 << 20  # size of the private tmpfs /tmp, the only writable place (memory: in the cap)
    max_requests: int | None = None  # recycle after this many answers; None: never
    # Recycle once the checker's memory exceeds this (docker: the cgroup's usage less inactive file cache, as
    # `docker stats` shows it; process: the tree's resident memory). A soft limit (Lean REPLs grow over many
    # proofs); the hard one is memory_limit_bytes.
    max_memory_bytes: int | None = None
    # Read at most this often, after an answer: a reading (docker: the cgroup's memory.stat, ~0.17 ms; process:
    # the tree's /proc, ~0.6 ms) costs as much as a Countdown check.
    memory_check_interval_s: float = 1.0
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    stderr_tail_bytes: int = 4096
    handshake: Handshake = LEAN_HANDSHAKE  # asked as the checker starts: start() returns once it answered
    # From the start until the handshake's reply: the sandbox's setup and the checker's own start (interpreter,
    # REPL binary), not its work.
    start_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("argv is empty: give the checker command, e.g. ('python3', '-m', 'tasks.countdown_check')")
        _positive_or_none(self, "memory_limit_bytes", "pids_limit", "max_requests", "max_memory_bytes")
        if self.tmp_bytes <= 0 or self.start_timeout_s <= 0:
            raise ValueError(
                f"tmp_bytes and start_timeout_s must be positive: {self.tmp_bytes}, {self.start_timeout_s}"
            )
        if self.memory_check_interval_s < 0:
            raise ValueError(f"memory_check_interval_s must not be negative, not {self.memory_check_interval_s}")


@dataclass(frozen=True, kw_only=True)
class DockerSandboxConfig(SandboxConfig):
    image: str
    workdir: str | None = None  # the checker's cwd; None: the image's WORKDIR
    user: str = NOBODY  # "uid[:gid]" or a name in the image; never root
    cpus: float | None = 1.0  # CPU quota, in CPUs (nano_cpus)
    owner: str | None = None  # the worker's id in the owner label; None: docker_daemon.default_owner()
    oom_score_adj: int | None = 500  # under host memory pressure the kernel kills sandboxes before the worker
    runtime: str | None = None  # an OCI runtime registered with the daemon, e.g. "runsc" (gVisor)
    base_url: str | None = None  # the daemon, e.g. "unix:///var/run/docker.sock"; None: DOCKER_HOST or default
    api_timeout_s: float = 30.0  # per Docker API call
    start_timeout_s: float = 30.0  # after the container started: the interpreter or the REPL binary

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.image:
            raise ValueError("image is empty: give the checker image, e.g. proofstream-checker:latest")
        if self.user.split(":", 1)[0] in ("", "0", "root"):
            raise ValueError(f"user must not be root: {self.user!r}")
        _positive_or_none(self, "cpus")


@dataclass(frozen=True, kw_only=True)
class ProcessSandboxConfig(SandboxConfig):
    ro_paths: tuple[str, ...] = ()  # bound read-only: the Lean toolchain, the Python prefix, ...
    workdir: str = "/tmp"  # the checker's cwd (the Lean project); bound read-only unless under /tmp
    memory_poll_s: float = 0.05  # the tree cap's polling period during a request
    # "auto": also a memory cgroup capped at memory_limit_bytes where the host lets us make one
    # (verifier_pool.memcg); "off": the watchdog alone
    memory_cgroup: str = "auto"
    cpu_limit_s: int | None = 3600  # RLIMIT_CPU per process over its lifetime, a backstop
    fsize_limit_bytes: int | None = 64 << 20  # RLIMIT_FSIZE
    # Run as this host uid (the worker must be root). None: a uid of its own, leased from
    # [uid_base, uid_base + uid_count) when the worker is root; the worker's uid otherwise.
    uid: int | None = None
    gid: int | None = None  # defaults to uid
    uid_base: int = sandbox_uids.DEFAULT_UID_BASE
    uid_count: int = sandbox_uids.DEFAULT_UID_COUNT
    state_dir: str = "/run/proofstream"  # root workers: uid lock files and the staging mount point
    isolation: str = "auto"  # "auto" (bwrap, else unshare), "bwrap" or "unshare"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.isolation not in ("auto", *ISOLATION_TOOLS):
            raise ValueError(f"isolation must be auto, bwrap or unshare, not {self.isolation!r}")
        for path in (*self.ro_paths, self.workdir, self.state_dir):
            if not os.path.isabs(path):
                raise ValueError(f"sandbox paths must be absolute: {path!r}")
        _positive_or_none(self, "cpu_limit_s", "fsize_limit_bytes")
        if self.memory_cgroup not in ("auto", "off"):
            raise ValueError(f"memory_cgroup must be auto or off, not {self.memory_cgroup!r}")
        if self.memory_poll_s <= 0:
            raise ValueError(f"memory_poll_s must be positive, not {self.memory_poll_s}")


def _positive_or_none(config: SandboxConfig, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive or None, not {value}")
