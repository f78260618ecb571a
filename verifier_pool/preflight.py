"""`python -m verifier_pool.preflight`: can a verifier with these settings check Lean proofs? Silent with exit
status 0 if it can; else one line on stdout saying what is missing and the ways to get it, and exit status 1.

Settings as a worker reads them (PROOFSTREAM_* and the TOML file's [verifier] table), but for the rule that a
Lean task needs a backend: that rule is what this module words for the operator. The local pipeline
(trainer/local.py) runs it with the environment it gives its verifier workers, before it starts anything,
so a run that could never check a proof stops at once instead of after loading the model; the trainer asks
across the process boundary because roles do not import each other.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import httpx
from pydantic import model_validator

from streams.settings import SettingsError
from verifier_pool import docker_daemon
from verifier_pool.config import VerifierSettings
from verifier_pool.pool import NO_LEAN

UNCONFIRMED = (
    "every Lean proof the server accepts would be `error`: nothing can confirm it (verifier_pool.lean_audit). "
    "Set lean_second_line = 'trust_repl' to take the Lean server's word"
)


class LeanSettings(VerifierSettings):
    """VerifierSettings, loaded alike, without the check that a Lean task has a backend (config.py
    `_lean_needs_a_backend`): `lean_backend_problem` makes it, in the operator's words."""

    @model_validator(mode="after")
    def _lean_needs_a_backend(self) -> LeanSettings:
        return self


def lean_backend_problem(settings: VerifierSettings) -> str | None:
    """None if a Lean backend is configured and reachable; else what is missing and the ways to get one."""
    if settings.sandbox == "kimina" or settings.kimina_url:
        if not settings.kimina_url:
            return "sandbox = 'kimina' needs kimina_url. " + NO_LEAN
        if settings.lean_second_line == "audit":  # the server keeps the proof's env: no audit can run
            return f"with kimina-lean-server {UNCONFIRMED}."
        try:
            httpx.get(settings.kimina_url.rstrip("/") + "/health", timeout=5.0)
        except httpx.HTTPError as e:
            return f"the kimina-lean-server at {settings.kimina_url} does not answer ({e}). " + NO_LEAN
        return None
    if settings.lean_repl_cmd:
        exe = settings.lean_repl_cmd[0]
        if shutil.which(exe) is None and not Path(exe).is_file():
            return f"lean_repl_cmd {settings.lean_repl_cmd} cannot run: {exe!r} is not on PATH. " + NO_LEAN
        if settings.sandbox != "docker" and settings.lean_second_line == "audit" and not settings.lean_audit_cmd:
            return f"with lean_repl_cmd and no lean_audit_cmd (e.g. ['lean-audit']) {UNCONFIRMED}."
        return None
    if settings.sandbox in ("auto", "docker") and docker_daemon.daemon_ready(settings.lean_image):
        return None
    return f"no Lean backend found (no image {settings.lean_image!r} in a reachable Docker daemon). " + NO_LEAN


def main() -> int:
    try:
        settings = LeanSettings.load()
    except SettingsError as e:  # a value of the wrong type or kind: no worker would start either
        print(e)
        return 1
    if "lean" in settings.tasks and (problem := lean_backend_problem(settings)):
        print(problem)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
