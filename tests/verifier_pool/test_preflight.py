"""The verifier's Lean preflight (`python -m verifier_pool.preflight`): each reason a verifier could not check a
Lean proof, in the words the operator reads before anything starts (each naming the way out), and the
command's contract (silent and 0 when ready; one line and 1 when not)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from verifier_pool.config import VerifierSettings
from verifier_pool.pool import NO_LEAN
from verifier_pool.preflight import LeanSettings, lean_backend_problem

ROOT = Path(__file__).resolve().parents[2]
MISSING_IMAGE = "proofstream-no-such-image:0"


def _settings(**fields) -> VerifierSettings:
    return LeanSettings.load(flags={"tasks": ["lean"], **fields}, env={})


def test_a_local_repl_needs_a_runnable_command_and_an_audit_unless_its_word_is_trusted():
    repl = {"sandbox": "process", "lean_repl_cmd": [sys.executable, "-c", "pass"]}
    assert lean_backend_problem(_settings(**repl)) == (
        "with lean_repl_cmd and no lean_audit_cmd (e.g. ['lean-audit']) every Lean proof the server accepts "
        "would be `error`: nothing can confirm it (verifier_pool.lean_audit). Set lean_second_line = "
        "'trust_repl' to take the Lean server's word."
    )
    assert lean_backend_problem(_settings(**repl, lean_audit_cmd=["lean-audit"])) is None
    assert lean_backend_problem(_settings(**repl, lean_second_line="trust_repl")) is None
    missing = _settings(sandbox="process", lean_repl_cmd=["no-such-repl-binary"])
    assert lean_backend_problem(missing) == (
        "lean_repl_cmd ['no-such-repl-binary'] cannot run: 'no-such-repl-binary' is not on PATH. " + NO_LEAN
    )


def test_a_kimina_server_must_be_named_answer_and_cannot_be_audited():
    assert lean_backend_problem(_settings(sandbox="kimina")) == "sandbox = 'kimina' needs kimina_url. " + NO_LEAN
    nowhere = {"sandbox": "kimina", "kimina_url": "http://127.0.0.1:9"}  # port 9 (discard): nothing listens
    problem = lean_backend_problem(_settings(**nowhere))
    assert problem == (
        "with kimina-lean-server every Lean proof the server accepts would be `error`: nothing can confirm it "
        "(verifier_pool.lean_audit). Set lean_second_line = 'trust_repl' to take the Lean server's word."
    )
    problem = lean_backend_problem(_settings(**nowhere, lean_second_line="trust_repl"))
    assert problem.startswith("the kimina-lean-server at http://127.0.0.1:9 does not answer (") and problem.endswith(
        "). " + NO_LEAN
    )


def test_without_a_repl_or_a_server_the_image_must_be_in_a_docker_daemon():
    missing = f"no Lean backend found (no image {MISSING_IMAGE!r} in a reachable Docker daemon). " + NO_LEAN
    for sandbox in ("docker", "process"):  # the process sandbox has nothing to run without lean_repl_cmd
        assert lean_backend_problem(_settings(sandbox=sandbox, lean_image=MISSING_IMAGE)) == missing
    assert "docker build -t proofstream-lean" in NO_LEAN and "lean_repl_cmd" in NO_LEAN and "kimina_url" in NO_LEAN


def _preflight(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PROOFSTREAM_")}
    return subprocess.run(
        [sys.executable, "-m", "verifier_pool.preflight"],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_command_says_one_line_and_exits_1_or_nothing_and_0():
    lean = {"PROOFSTREAM_TASKS": '["lean"]'}
    missing = _preflight(**lean, PROOFSTREAM_SANDBOX="docker", PROOFSTREAM_LEAN_IMAGE=MISSING_IMAGE)
    assert missing.returncode == 1 and missing.stdout.count("\n") == 1 and "no Lean backend found" in missing.stdout
    ready = _preflight(
        **lean,
        PROOFSTREAM_SANDBOX="process",
        PROOFSTREAM_LEAN_SECOND_LINE="trust_repl",
        PROOFSTREAM_LEAN_REPL_CMD=f'["{sys.executable}"]',
    )
    assert (ready.returncode, ready.stdout, ready.stderr) == (0, "", "")
    kimina = _preflight(**lean, PROOFSTREAM_SANDBOX="kimina")  # a worker would refuse these settings; this says why
    assert (kimina.returncode, kimina.stdout) == (1, "sandbox = 'kimina' needs kimina_url. " + NO_LEAN + "\n")
    bad = _preflight(**lean, PROOFSTREAM_SANDBOX="nope")
    assert bad.returncode == 1 and bad.stdout.count("\n") == 1
    assert bad.stdout.startswith("bad verifier settings: sandbox (from PROOFSTREAM_SANDBOX): Input should be")
    assert _preflight().returncode == 0  # no lean task: nothing to check
