"""The compose stack, for real: compose.yaml + compose.cpu.yaml brought up with the images that
ops/deploy/docker_setup.sh builds (ops/deploy/images/build.sh), a short Countdown ES run on the hf engine, rewards
checked in the stack's own Redis and in the trainer's report, and everything removed again (containers, network,
volumes), also when an assertion fails.

Skipped with the reason when there is no Docker daemon, no compose (v2 `docker compose` or v1 `docker-compose`)
or no images. Bounded: every command has a timeout, the run a deadline, the whole test a pytest timeout.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ["-f", "compose.yaml", "-f", "compose.cpu.yaml"]
APP_IMAGE = os.environ.get("PROOFSTREAM_IMAGE", "proofstream-app:latest")
REDIS_IMAGE = os.environ.get("PROOFSTREAM_REDIS_IMAGE", "proofstream-redis:latest")
RUN_DEADLINE_S = 420  # the trainer's run, from `up` returning; ~2-4 min on 2 busy cores
ITERATIONS = 2
# A run small enough for 2 cores: 2 members of 2 problems a version, short answers, no evaluation. One engine
# thread: with two OpenMP threads on two cores that other processes share, generation fell from ~26 to ~1-3
# tokens/s here (spinning barriers waiting for a descheduled thread).
RUN_ENV = {
    "PROOFSTREAM_ITERATIONS": str(ITERATIONS),
    "PROOFSTREAM_POPULATION": "2",
    "PROOFSTREAM_BATCH": "2",
    "PROOFSTREAM_MAX_NEW_TOKENS": "24",
    "PROOFSTREAM_PROBLEMS": "16",
    "PROOFSTREAM_HELD_OUT": "2",
    "PROOFSTREAM_EVAL_EVERY": "0",
    "PROOFSTREAM_GENERATOR_THREADS": "1",
    "PROOFSTREAM_VERIFIER_CONCURRENCY": "1",
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_DEADLINE_S + 240)]


def _ok(argv: list[str], timeout_s: float = 15) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout_s).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _compose_command() -> list[str] | None:
    if _ok(["docker", "compose", "version"]):
        return ["docker", "compose"]
    if shutil.which("docker-compose") and _ok(["docker-compose", "version"]):
        return ["docker-compose"]
    return None


def _why_skip() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI (ops/deploy/docker_setup.sh installs docker.io)"
    if not _ok(["docker", "info"], timeout_s=20):
        return "no Docker daemon answers (ops/deploy/docker_setup.sh starts one where it can)"
    if _compose_command() is None:
        return "no compose: neither `docker compose` nor `docker-compose` (apt-get install docker-compose)"
    missing = [i for i in (APP_IMAGE, REDIS_IMAGE) if not _ok(["docker", "image", "inspect", i])]
    if missing:
        return f"image(s) {', '.join(missing)} not built (ops/deploy/docker_setup.sh, or ops/deploy/images/build.sh)"
    return None


_WHY = _why_skip()
if _WHY is not None:
    print(f"compose test skipped: {_WHY}")


class Stack:
    """One compose project with its own name, so its containers, network and volumes are its own."""

    def __init__(self) -> None:
        self.project = f"pstest{uuid.uuid4().hex[:10]}"
        self.run = f"deploy-{uuid.uuid4().hex[:8]}"
        self.compose = _compose_command() or []
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
        self.env = {
            **env,
            **RUN_ENV,
            "PROOFSTREAM_RUN": self.run,
            "PROOFSTREAM_IMAGE": APP_IMAGE,
            "PROOFSTREAM_REDIS_IMAGE": REDIS_IMAGE,
        }

    def __call__(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        argv = [*self.compose, "-p", self.project, *FILES, *args]
        return subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout_s)

    def container(self, service: str) -> str:
        ids = self("ps", "-q", service).stdout.split()
        assert ids, f"no container for {service}"
        return ids[0]

    def redis(self, *command: str) -> str:
        out = self("exec", "-T", "redis", "redis-cli", *command, timeout_s=30)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def health(self, service: str) -> str:
        out = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Health.Status}}", self.container(service)],
            capture_output=True,
            text=True,
            timeout=15,
        )
        return out.stdout.strip()

    def logs(self) -> str:
        try:
            return self("logs", "--no-color", "--tail", "40", timeout_s=60).stdout[-12000:]
        except subprocess.TimeoutExpired:
            return "(compose logs timed out)"

    def down(self) -> None:
        """compose down -v; then whatever still carries the project's label, by id (a failed down leaves it)."""
        with contextlib.suppress(subprocess.TimeoutExpired):  # the label sweep below removes what it left
            self("down", "-v", "--remove-orphans", "-t", "10", timeout_s=120)
        label = f"label=com.docker.compose.project={self.project}"
        for kind, remove in (("container", ["rm", "-f", "-v"]), ("network", ["rm"]), ("volume", ["rm", "-f"])):
            listing = ["docker", kind, "ls", "-q", "--filter", label] + (["-a"] if kind == "container" else [])
            ids = subprocess.run(listing, capture_output=True, text=True, timeout=30).stdout.split()
            if ids:
                subprocess.run(["docker", kind, *remove, *ids], capture_output=True, timeout=120)


@pytest.fixture
def stack():
    s = Stack()
    try:
        yield s
    finally:
        s.down()


@pytest.mark.skipif(_WHY is not None, reason=f"compose test skipped: {_WHY}")
def test_cpu_stack_runs_es_end_to_end(stack: Stack) -> None:
    started = time.monotonic()
    up = stack("up", "-d", timeout_s=240)
    assert up.returncode == 0, f"compose up failed:\n{up.stderr[-4000:]}\n{stack.logs()}"
    trainer = stack.container("trainer")

    # The trainer is the one-shot job: wait for it to exit, bounded.
    remaining = RUN_DEADLINE_S - (time.monotonic() - started)
    try:
        waited = subprocess.run(["docker", "wait", trainer], capture_output=True, text=True, timeout=remaining)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the trainer did not finish {ITERATIONS} versions in {RUN_DEADLINE_S} s:\n{stack.logs()}")
    assert waited.stdout.strip() == "0", f"trainer exited with {waited.stdout.strip()}:\n{stack.logs()}"

    rewards = int(stack.redis("XLEN", f"{{ps:{stack.run}}}:rewards"))
    assert stack.redis("XLEN", f"{{ps:{stack.run}}}:dlq") == "0", stack.logs()

    # The report, from the runs volume through the exited container.
    path = f"{trainer}:/var/lib/proofstream/runs/{stack.run}/report.json"
    copied = subprocess.run(["docker", "cp", path, "-"], capture_output=True, timeout=30)
    assert copied.returncode == 0, copied.stderr
    with tarfile.open(fileobj=io.BytesIO(copied.stdout)) as tar:
        report = json.load(tar.extractfile("report.json"))
    assert report["version"] == ITERATIONS and not report["interrupted"]
    assert report["settings"]["redis_url"] == "redis://redis:6379/0"  # only the trainer ran in its container
    used = report["counts"]["members_used"]
    assert used >= ITERATIONS * 2  # an ES update needs at least two members
    batch = int(RUN_ENV["PROOFSTREAM_BATCH"])
    assert rewards >= used * batch, f"{rewards} rewards for {used} members of {batch} problems:\n{stack.logs()}"

    # The long-running services passed their own health checks (ops/deploy/health.py, arq --check, redis-cli ping).
    for service in ("redis", "verifier", "generator-cpu"):
        assert stack.health(service) == "healthy", f"{service}: {stack.health(service)}\n{stack.logs()}"
    print(f"compose stack: {rewards} rewards, {ITERATIONS} versions in {time.monotonic() - started:.0f} s")
