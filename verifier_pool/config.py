"""The verifier pool's settings (TOML table `[verifier]`, env `PROOFSTREAM_<FIELD>`)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from streams.role_settings import SandboxSettings
from verifier_pool.sandbox_config import CHECKER_IMAGE

# Consumer tasks per slot of sandboxes: one checks while the other settles and reads (consumers.service).
TASKS_PER_SLOT = 2


class VerifierSettings(SandboxSettings):
    section = "verifier"

    concurrency: int = Field(0, ge=0, description="checks at once (slots of warm sandboxes); 0: the CPU count")
    tasks: list[Literal["lean", "countdown"]] = Field(
        default_factory=lambda: ["countdown"], description="checkers to keep warm; lean needs a Lean backend"
    )
    # The sandbox and its Lean backend: streams.role_settings.SandboxSettings.
    lean_toolchain_dir: str = Field("", description="elan's home (e.g. /opt/elan): bound read-only, bin/ on PATH")
    lean_toolchain: str = Field("unknown", description="part of the verdict cache key, e.g. v4.19.0+mathlib")
    # Sent as `Authorization: Bearer <key>` to a server started with LEAN_SERVER_API_KEY. SecretStr: shown as
    # '**********' wherever settings are printed or dumped. Give it by env, not a flag (argv is world-readable).
    kimina_api_key: SecretStr | None = Field(None, description="kimina-lean-server's API key (env only)")
    checker_image: str = Field(CHECKER_IMAGE, description="the Countdown checker (docker sandbox)")

    proof_timeout_s: float = Field(60.0, gt=0, description="a Lean proof's time limit: past it, verdict timeout")
    header_timeout_s: float = Field(600.0, gt=0, description="elaborating the Lean header (import Mathlib) once a REPL")
    countdown_timeout_s: float = Field(5.0, gt=0, description="a Countdown check's time limit")
    memory_limit_mb: int = Field(8192, gt=0, description="per sandbox (RLIMIT_AS or the container limit)")
    cpus: float = Field(1.0, gt=0, description="CPU share of a docker sandbox")
    recycle_after: int = Field(500, gt=0, description="restart a sandbox after this many requests")
    recycle_memory_mb: int = Field(6144, gt=0, description="restart a sandbox past this resident memory")

    read_batch: int = Field(0, ge=0, description="attempts a task reads at once; 0: 16 without lean, else 1")
    max_deliveries: int = Field(5, ge=1, description="an attempt delivered this often is dead-lettered")
    # Reclaim deadline of an attempt whose worker died or stalled. Live workers refresh their claims every
    # fifth of it (streams.runtime), so it does not depend on how long a check may take.
    claim_idle_ms: int = Field(25_000, ge=1000, description="a dead or stalled worker's attempts move on after this")
    sweep_every_s: int = Field(30, ge=1, le=59, description="the housekeeping sweeps' period (arq cron)")
    history_s: float = Field(3600.0, ge=0, description="judged attempts (their text: the run's traces) kept this long")
    sandbox_uid: int | None = Field(None, description="run checkers as this uid when the worker is root")

    @model_validator(mode="after")
    def _lean_needs_a_backend(self) -> VerifierSettings:
        if "lean" in self.tasks and self.sandbox == "process" and not self.lean_repl_cmd:
            raise ValueError(
                "the lean task with the process sandbox needs lean_repl_cmd (e.g. ['lake', 'env', 'repl']) "
                "and lean_workdir; or use sandbox = 'docker' with lean_image, or 'kimina' with kimina_url"
            )
        if self.sandbox == "kimina" and not self.kimina_url:
            raise ValueError("sandbox = 'kimina' needs kimina_url (e.g. http://kimina:8000)")
        return self

    @property
    def batch_size(self) -> int:
        """Attempts a consumer task reads at once. Their verdicts are looked up in one round trip and the
        misses checked in order, so a task may hold a batch behind its current check: free with Countdown's
        millisecond checks (and what lets a pool serve cache hits at wire speed), but a Lean batch would
        queue minutes of checks behind one slot while others idle at the end of a version."""
        return self.read_batch or (1 if "lean" in self.tasks else 16)

    @property
    def workers(self) -> int:
        return self.concurrency or os.cpu_count() or 1
