"""Build the sandboxes and checkers one verifier consumer task owns, from VerifierSettings."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tasks import countdown_check
from verifier_pool import docker_backend, docker_daemon, lean_audit, process
from verifier_pool.checkers import CountdownChecker, LeanChecker
from verifier_pool.config import VerifierSettings
from verifier_pool.kimina import KiminaChecker
from verifier_pool.lean_audit import LeanAudit, SecondLine
from verifier_pool.repl import LEAN_HANDSHAKE, Handshake
from verifier_pool.sandbox import Sandbox, SandboxUnavailable
from verifier_pool.sandbox_config import DockerSandboxConfig, ProcessSandboxConfig

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
# The checker must be this checkout's: an image built before the checker was edited would judge by the old
# rules (its digest differs), so its sandbox does not start and the run says why.
COUNTDOWN_HANDSHAKE = Handshake(
    countdown_check.HANDSHAKE_REQUEST,
    {**countdown_check.HANDSHAKE_REPLY, "digest": countdown_check.CHECKER_DIGEST},
    hint="a checker other than this checkout's tasks/countdown_check.py (an image built from older code?): "
    "rebuild it with `bash ops/deploy/docker_setup.sh` (or ops/deploy/images/build.sh)",
)

NO_LEAN = (
    "the lean task needs a Lean REPL and none is configured. Ways to get one: (1) Docker: build the image "
    "`docker build -t proofstream-lean ops/deploy/images/lean` and set sandbox = 'docker'; (2) a local toolchain: "
    "set lean_repl_cmd = ['lake', 'env', 'repl'] and lean_workdir to a Mathlib project with the REPL; "
    "(3) a kimina-lean-server: set sandbox = 'kimina' and kimina_url."
)


def _python_paths() -> tuple[str, ...]:
    """What the Countdown checker needs inside a process sandbox: the base interpreter's prefix (the checker
    is stdlib only, so no virtualenv) and the tasks package, not the checkout (its .git, its .venv, whatever
    else lies there)."""
    paths = {os.path.realpath(sys.base_prefix), os.path.join(PROJECT_ROOT, "tasks")}
    return tuple(sorted(p for p in paths if os.path.isdir(p)))


def _base_python() -> str:
    """The interpreter behind this one (a virtualenv's python is a symlink to it, and needs the venv)."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def image_for(settings: VerifierSettings, task: str) -> str:
    return settings.checker_image if task == "countdown" else settings.lean_image


def backend(settings: VerifierSettings, task: str) -> str:
    """auto: docker when a daemon answers and this task's image exists, else the process sandbox."""
    if settings.sandbox != "auto":
        return settings.sandbox
    return "docker" if docker_daemon.daemon_ready(image_for(settings, task)) else "process"


def backends(settings: VerifierSettings) -> dict[str, str]:
    """The backend of each task, decided once per process (auto asks the Docker daemon)."""
    return {task: backend(settings, task) for task in settings.tasks}


def make_sandbox(settings: VerifierSettings, task: str, index: int, kind: str) -> Sandbox:
    if kind == "kimina" and task == "countdown":
        kind = "process"  # kimina-lean-server checks Lean only; the Countdown checker runs locally
    if kind == "docker":
        config = DockerSandboxConfig(
            image=image_for(settings, task),
            argv=docker_backend.COUNTDOWN_ARGV if task == "countdown" else docker_backend.LEAN_REPL_ARGV,
            memory_limit_bytes=settings.memory_limit_mb << 20,
            cpus=settings.cpus,
            max_requests=settings.recycle_after,
            max_memory_bytes=settings.recycle_memory_mb << 20,
            handshake=COUNTDOWN_HANDSHAKE if task == "countdown" else LEAN_HANDSHAKE,
        )
        return docker_backend.DockerSandbox(config, sandbox_id=f"docker-{task}-{index}-{os.getpid()}")
    if task == "countdown":
        # -s: no user site-packages; -B: the package is bound read-only. PYTHONPATH finds tasks.
        argv = (_base_python(), "-s", "-B", "-m", "tasks.countdown_check")
    elif settings.lean_repl_cmd:
        argv = tuple(settings.lean_repl_cmd)
    else:
        raise SandboxUnavailable(NO_LEAN)
    if kind == "process":
        if task == "countdown":
            ro_paths, workdir, env = _python_paths(), "/tmp", {"PYTHONPATH": PROJECT_ROOT}
        else:
            ro_paths, workdir, env = _lean_place(settings)
        config = ProcessSandboxConfig(
            argv=argv,
            ro_paths=ro_paths,
            workdir=workdir,
            env=env,
            memory_limit_bytes=settings.memory_limit_mb << 20,
            max_requests=settings.recycle_after,
            max_memory_bytes=settings.recycle_memory_mb << 20,
            uid=settings.sandbox_uid,  # None: a uid of its own when the worker is root
            handshake=COUNTDOWN_HANDSHAKE if task == "countdown" else LEAN_HANDSHAKE,
        )
        return process.ProcessSandbox(config, sandbox_id=f"process-{task}-{index}-{os.getpid()}")
    raise SandboxUnavailable(f"sandbox backend {kind!r} is not built yet; use sandbox = 'process'")


def _lean_place(settings: VerifierSettings) -> tuple[tuple[str, ...], str, dict[str, str]]:
    """(ro_paths, workdir, env) of a Lean program in a process sandbox: the REPL's and the audit's alike."""
    toolchain = settings.lean_toolchain_dir
    ro_paths = tuple(p for p in (settings.lean_workdir, toolchain) if p)
    env = {"PATH": f"{toolchain}/bin:/usr/local/bin:/usr/bin:/bin"} if toolchain else {}
    return ro_paths, settings.lean_workdir or "/tmp", env


def second_line(settings: VerifierSettings, index: int, kind: str) -> SecondLine:
    """What decides a Lean checker's `proved` (verifier_pool.lean_audit): the audit program in a sandbox of its
    own, fresh for every audit, with the REPL's image or toolchain; without one (kimina, which keeps the env to
    itself, or a process backend without `lean_audit_cmd`), nothing (every such proof is `error`) unless the
    operator accepts the REPL's word."""
    if settings.lean_second_line == "trust_repl":
        return SecondLine(audit=None, trust_repl=True)
    sandbox: Sandbox
    if kind == "docker":
        config = DockerSandboxConfig(
            image=settings.lean_image,
            argv=lean_audit.AUDIT_ARGV,
            memory_limit_bytes=settings.memory_limit_mb << 20,
            cpus=settings.cpus,
            handshake=lean_audit.AUDIT_HANDSHAKE,
        )
        sandbox = docker_backend.DockerSandbox(config, sandbox_id=f"docker-audit-{index}-{os.getpid()}")
    elif kind == "process" and settings.lean_audit_cmd:
        ro_paths, workdir, env = _lean_place(settings)
        config = ProcessSandboxConfig(
            argv=tuple(settings.lean_audit_cmd),
            ro_paths=ro_paths,
            workdir=workdir,
            env=env,
            memory_limit_bytes=settings.memory_limit_mb << 20,
            uid=settings.sandbox_uid,
            handshake=lean_audit.AUDIT_HANDSHAKE,
        )
        sandbox = process.ProcessSandbox(config, sandbox_id=f"process-audit-{index}-{os.getpid()}")
    else:
        return SecondLine(audit=None)
    return SecondLine(LeanAudit(sandbox, timeout_s=settings.header_timeout_s + settings.proof_timeout_s))


def make_checkers(
    settings: VerifierSettings, index: int, kinds: dict[str, str] | None = None
) -> dict[str, CountdownChecker | LeanChecker | KiminaChecker]:
    kinds = kinds or backends(settings)
    checkers: dict[str, CountdownChecker | LeanChecker | KiminaChecker] = {}
    for task in settings.tasks:
        if task == "lean" and settings.sandbox == "kimina":  # the server is the sandbox; all tasks share its client
            checkers[task] = KiminaChecker(
                settings.kimina_url,
                timeout_s=settings.proof_timeout_s,
                toolchain=f"{settings.lean_toolchain}+kimina",
                sandbox_id=f"kimina-{task}-{index}-{os.getpid()}",
                api_key=settings.kimina_api_key.get_secret_value() if settings.kimina_api_key else None,
                second_line=second_line(settings, index, "kimina"),
            )
            continue
        sandbox = make_sandbox(settings, task, index, kinds[task])
        if task == "countdown":
            checkers[task] = CountdownChecker(sandbox, timeout_s=settings.countdown_timeout_s)
        else:
            checkers[task] = LeanChecker(
                sandbox,
                proof_timeout_s=settings.proof_timeout_s,
                header_timeout_s=settings.header_timeout_s,
                toolchain=settings.lean_toolchain,
                second_line=second_line(settings, index, kinds[task]),
            )
    return checkers
