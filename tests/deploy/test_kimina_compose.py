"""compose.yaml's `kimina` profile: `docker compose --env-file ops/deploy/kimina/compose.env --profile kimina up`
runs kimina-lean-server beside the stack and points the verifier at it. Its image needs the Lean image (GitHub to
build), so the stack is not started here: these tests check that the file resolves as documented and that the
settings it gives the verifier build a kimina checker for Lean."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from verifier_pool.config import VerifierSettings
from verifier_pool.kimina import KiminaChecker
from verifier_pool.pool import make_checkers

ROOT = Path(__file__).resolve().parents[2]
ENV_FILE = ROOT / "ops" / "deploy" / "kimina" / "compose.env"


def _env_file() -> dict[str, str]:
    lines = [line for line in ENV_FILE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def _compose(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("docker-compose"):
        argv = ["docker-compose"]
    elif (
        shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        argv = ["docker", "compose"]
    else:
        pytest.skip("neither docker-compose nor docker compose is installed (ops/deploy/docker_setup.sh)")
    return subprocess.run([*argv, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_kimina_server_is_only_started_by_its_profile():
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    assert services["kimina"]["profiles"] == ["kimina"]
    assert all("profiles" not in services[name] for name in ("redis", "verifier", "trainer"))


def test_the_env_file_gives_the_verifier_a_kimina_checker_for_lean():
    env = {k: v for k, v in _env_file().items() if k != "PROOFSTREAM_TASK"}  # the trainer's, not the verifier's
    settings = VerifierSettings.load(env=env)
    checker = make_checkers(settings, 0)["lean"]
    assert isinstance(checker, KiminaChecker) and checker.client.url == "http://kimina:8000"
    assert checker.second_line.trust_repl  # kimina cannot hand over a proof's env to audit


def test_the_profile_resolves_with_the_env_file():
    done = _compose("--env-file", str(ENV_FILE), "-f", "compose.yaml", "--profile", "kimina", "config")
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    verifier = services["verifier"]["environment"]
    for key, value in _env_file().items():
        where = services["trainer"]["environment"] if key == "PROOFSTREAM_TASK" else verifier
        assert str(where[key]) == value, key
    assert services["kimina"]["image"] == "proofstream-kimina:latest"
