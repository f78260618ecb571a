"""What the sandbox suites (test_docker_sandbox, test_process_sandbox, test_sandbox_probes) share: the fake REPL
(ops/bench/synthetic_repl.py, a test double driven by FIXTURE: markers) as the checker of either backend, the
backends that work here as pytest params, and the sandboxes a test started, killed at its end.

A backend is named as the tests parametrize it: "docker", or the process backend's isolation tool ("bwrap",
"unshare"). Settings are given by SandboxConfig's names, the same for both backends.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from tests import fixtures
from verifier_pool import docker_daemon, process_argv
from verifier_pool.docker_backend import DockerSandbox
from verifier_pool.process import ProcessSandbox
from verifier_pool.sandbox_config import CHECKER_IMAGE, ISOLATION_TOOLS, DockerSandboxConfig, ProcessSandboxConfig

FIXTURES = Path(__file__).parents[1] / "fixtures"
FAKE_REPL = fixtures.FAKE_REPL
REPL_DIR = FAKE_REPL.parent  # the folder bound into the process sandboxes
PYTHON = os.path.realpath(sys.executable)  # the interpreter itself: the venv's symlinks are not bound
IMAGE = os.environ.get("PROOFSTREAM_CHECKER_IMAGE", CHECKER_IMAGE)
# In a container: the fake REPL's source as the image's python3 `-c` argument, so nothing is mounted.
FAKE_REPL_ARGV = ("python3", "-c", FAKE_REPL.read_text())
RUN = f"pytest-{uuid.uuid4().hex[:8]}"  # the owner labels of this test process's containers start with it
OWNER = docker_daemon.default_owner(prefix=f"{RUN}/")  # provably alive: this process
NO_DOCKER = docker_daemon.why_unavailable(IMAGE)  # None where a daemon answers and has the image
# What the process sandbox's root may show besides the top directory of each bound path: the system dirs,
# /etc's few files, /proc, /dev, /tmp.
PROCESS_ROOT = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "tmp"}


def config(backend: str, **overrides) -> DockerSandboxConfig | ProcessSandboxConfig:
    """The fake REPL as `backend`'s checker, capped at 512 MiB, with `overrides`."""
    if backend == "docker":
        fields = {"image": IMAGE, "argv": FAKE_REPL_ARGV, "owner": OWNER, "memory_limit_bytes": 512 << 20}
        return DockerSandboxConfig(**(fields | overrides))
    fields = {
        "argv": (PYTHON, "-I", str(FAKE_REPL)),
        "ro_paths": (sys.base_prefix, str(REPL_DIR)),
        "memory_limit_bytes": 512 << 20,
        "isolation": backend,
    }
    return ProcessSandboxConfig(**(fields | overrides))


def sandbox(backend: str, **overrides) -> DockerSandbox | ProcessSandbox:
    """A sandbox of `backend` around config(backend, **overrides), not started."""
    built = config(backend, **overrides)
    return DockerSandbox(built) if isinstance(built, DockerSandboxConfig) else ProcessSandbox(built)


def isolations() -> list:
    """The process backend's isolation tools as pytest params, skipped with the reason where one does not work."""
    return [pytest.param(tool, marks=pytest.mark.skipif(bool(why), reason=str(why))) for tool, why in _probes()]


def backends() -> list:
    """Every backend as a pytest param, skipped with the reason where it does not work here."""
    docker = pytest.param("docker", marks=pytest.mark.skipif(NO_DOCKER is not None, reason=str(NO_DOCKER)))
    return [*isolations(), docker]


def _probes() -> list[tuple[str, str | None]]:
    found = [(tool, process_argv.probe(tool)) for tool in ISOLATION_TOOLS]
    if all(why for _, why in found):
        print(f"process sandbox tests skipped: neither bwrap nor unshare works here ({found})")
    return found


class Started:
    """The sandboxes of one test: `await started(**overrides)` starts one of `backend` (the `defaults`, then
    `overrides`); leaving the `async with` kills them all."""

    def __init__(self, backend: str, **defaults) -> None:
        self.backend = backend
        self.defaults = defaults
        self.sandboxes: list[DockerSandbox | ProcessSandbox] = []

    async def __call__(self, **overrides) -> DockerSandbox | ProcessSandbox:
        started = sandbox(self.backend, **(self.defaults | overrides))
        self.sandboxes.append(started)
        await started.start()
        return started

    async def __aenter__(self) -> Started:
        return self

    async def __aexit__(self, *exc_info) -> None:
        for started in self.sandboxes:
            await started.kill()
