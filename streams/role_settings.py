"""Settings two roles declare alike: the verifier runs its sandboxes with them, and the trainer hands them to
the verifiers of its local pipeline (trainer/local.py). Each is declared here once, so its flag, TOML key,
variable, default and help are the same in both (`python -m trainer --help`, the verifier's settings).

The other settings a role shares with the trainer live with what they name, below the roles too:
`weights.settings.ModelSettings` (the model and the generator's engine) and `tasks.prompts.PromptSettings`
(the prompt format).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from streams.settings import RoleSettings


class SandboxSettings(RoleSettings):
    """Where the checks run: the sandbox kind and the Lean backend behind it (a Docker image, a local toolchain
    command, or a kimina-lean-server)."""

    sandbox: Literal["auto", "docker", "process", "kimina"] = Field(
        "auto",
        description="the verifiers' sandboxes; auto: docker if a daemon answers and the image exists, else process",
    )
    kimina_url: str = Field("", description="a kimina-lean-server (sandbox kimina), e.g. http://kimina:8000")
    lean_repl_cmd: list[str] = Field(
        default_factory=list, description='the Lean REPL (process sandbox), e.g. ["lake", "env", "repl"]'
    )
    lean_workdir: str = Field("", description="the Mathlib project the REPL runs in (process sandbox)")
    lean_image: str = Field("proofstream-lean:latest", description="the Lean REPL image (docker sandbox)")
    # Who decides a Lean `proved` (verifier_pool.lean_audit): "audit", the trusted lean-audit program in a fresh
    # sandbox (docker: lean-audit from lean_image; process: lean_audit_cmd); where none can run, every such proof
    # is `error`. "trust_repl": the Lean server's own answers, which code run from the proof can forge.
    lean_second_line: Literal["audit", "trust_repl"] = Field(
        "audit", description="audit: a fresh sandbox re-checks what was proved; trust_repl: the Lean server's word"
    )
    lean_audit_cmd: list[str] = Field(
        default_factory=list,
        description='the audit program of a Lean verdict\'s second line (process sandbox), e.g. ["lean-audit"]',
    )
