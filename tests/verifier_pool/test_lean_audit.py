"""The second line of the Lean verdict (verifier_pool.lean_audit) and LeanChecker's use of it.

Real parts: the REPL and the audit program each run in a real process sandbox (bubblewrap or unshare); the
pickle is taken out of the REPL's sandbox through /proc. The programs are test doubles: the fake REPL
(ops/bench/synthetic_repl.py) and a double of our own audit program (tests/fixtures/fake_audit.py). Nothing
here runs Lean or the real lean-audit (ops/deploy/images/lean/audit/Main.lean).

A forged REPL is the fake REPL with a FIXTURE:forge marker: its stdout says proved and the default axioms,
exactly as a check without the second line accepts (asserted below), while the env it pickles says otherwise.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from consumers.service import VerifierService
from streams.theorems import Theorem
from tests.fixtures import FAKE_REPL
from verifier_pool import docker_backend, docker_daemon, lean_audit, process
from verifier_pool.checkers import LeanChecker
from verifier_pool.config import VerifierSettings
from verifier_pool.lean_audit import LeanAudit, SecondLine, judge_audit
from verifier_pool.pool import PROJECT_ROOT, _python_paths, second_line
from verifier_pool.repl import LEAN_HANDSHAKE
from verifier_pool.sandbox_config import CHECKER_IMAGE, DockerSandboxConfig, ProcessSandboxConfig

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(process.available() is None, reason="neither bubblewrap nor unshare works here"),
]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STATEMENT = "theorem mathd_numbertheory_188 : Nat.gcd 180 168 = 12 := by"
THEOREM = Theorem("t", "lean", statement=STATEMENT, header="import Mathlib\nimport Aesop\n")
GOOD = f"{STATEMENT}\n  norm_num"


def _sandbox(script: str, *args: str) -> process.ProcessSandbox:
    config = ProcessSandboxConfig(
        argv=(sys.executable, str(FIXTURES / script), *args),
        ro_paths=(*_python_paths(),),
        workdir=PROJECT_ROOT,
        memory_limit_bytes=1 << 30,
        handshake=lean_audit.AUDIT_HANDSHAKE if script == "fake_audit.py" else LEAN_HANDSHAKE,
    )
    return process.ProcessSandbox(config)


@pytest.fixture
async def checkers():
    """Factory: a LeanChecker on the fake REPL with the given second line; every sandbox killed after."""
    made: list[LeanChecker] = []

    def make(line: SecondLine) -> LeanChecker:
        made.append(LeanChecker(_sandbox(FAKE_REPL), proof_timeout_s=5, header_timeout_s=5, second_line=line))
        return made[-1]

    yield make
    for checker in made:
        await checker.sandbox.kill()
        if checker.second_line.audit is not None:
            await checker.second_line.audit.sandbox.kill()


def audited(*args: str) -> SecondLine:
    return SecondLine(LeanAudit(_sandbox("fake_audit.py", *args), timeout_s=5))


async def test_an_honest_proof_is_proved_by_the_audit(checkers):
    checker = checkers(audited())
    judgement = await checker.check(THEOREM, GOOD)
    assert (judgement.verdict, judgement.detail) == ("proved", "kernel replay in a fresh sandbox")
    assert checker.second_line.audit.sandbox.pid is None  # killed after its audit: no process outlives it


# Helper declarations go to Lean in the same command as the theorem (tests/verifier_pool/
# test_lean_commands.py for the text). The fake REPL gives a declaration the axioms of those its text names, as
# `#print axioms` (and the audit's CollectAxioms) follows every constant a proof uses.
HELPER = "lemma two (n : ℕ) : n + n = 2 * n := by -- FIXTURE:axiom=Lean.ofReduceBool\n  ring\n"


@pytest.mark.parametrize("second", ["repl", "audit"])
async def test_the_axioms_of_a_helper_the_theorem_uses_are_the_theorems(checkers, second):
    line = SecondLine(audit=None, trust_repl=True) if second == "repl" else audited()
    used = await checkers(line).check(THEOREM, f"{HELPER}{STATEMENT}\n  norm_num [two]")
    assert (used.verdict, used.reason) == ("rejected", "integrity")
    assert used.detail == "trusts the compiler: Lean.ofReduceBool"
    unused = await checkers(line).check(THEOREM, f"{HELPER}{STATEMENT}\n  norm_num")  # Lean checks it, uses it not
    assert unused.verdict == "proved", unused


# A theorem inside a namespace (FYDY's Putnam 2025, Harmonic's IMO 2025 P1 proofs): sent under `open P in`, out of
# the namespace, only where the audit compares the statement (`open P` could change how it reads).
NAMESPACED = f"namespace P\nlemma two (n : ℕ) : n + n = 2 * n := by\n  ring\n{STATEMENT}\n  norm_num [two]\nend P\n"


async def test_a_namespace_open_at_the_statement_goes_to_lean_only_where_the_audit_runs(checkers):
    judgement = await checkers(audited()).check(THEOREM, NAMESPACED)
    assert (judgement.verdict, judgement.detail) == ("proved", "kernel replay in a fresh sandbox"), judgement
    word = await checkers(SecondLine(audit=None, trust_repl=True)).check(THEOREM, NAMESPACED)
    assert (word.verdict, word.reason) == ("rejected", "integrity"), word
    assert word.detail.startswith("before the statement: forbidden: namespace P open at the statement"), word
    assert "only the audit, off here" in word.detail


async def test_the_audit_judges_the_environment_the_helpers_went_into(checkers):
    forged = "lemma two (n : ℕ) : n + n = 2 * n := by -- FIXTURE:forge=sorryAx\n  ring\n"
    proof = f"{forged}{STATEMENT}\n  norm_num [two]\n#print axioms mathd_numbertheory_188"
    assert (await checkers(SecondLine(audit=None, trust_repl=True)).check(THEOREM, proof)).verdict == "proved"
    judgement = await checkers(audited()).check(THEOREM, proof)
    assert (judgement.verdict, judgement.reason) == ("rejected", "sorry"), judgement


async def test_the_time_limit_of_a_proof_covers_its_helpers():
    checker = LeanChecker(
        _sandbox(FAKE_REPL),
        proof_timeout_s=1,
        header_timeout_s=5,
        second_line=SecondLine(audit=None, trust_repl=True),
    )
    try:
        slow = "lemma two (n : ℕ) : n + n = 2 * n := by -- FIXTURE:slow=3\n  ring\n"
        judgement = await checker.check(THEOREM, f"{slow}{STATEMENT}\n  norm_num [two]")
        assert (judgement.verdict, judgement.detail) == ("timeout", "no answer within 1 s"), judgement
    finally:
        await checker.sandbox.kill()


@pytest.mark.parametrize(
    "marker, verdict, reason",
    [
        ("FIXTURE:forge=sorryAx", "rejected", "sorry"),
        ("FIXTURE:forge=Lean.ofReduceBool", "rejected", "integrity"),
        ("FIXTURE:forge=False.elim_axiom", "rejected", "integrity"),
        ("FIXTURE:forge=type", "rejected", "integrity"),
        ("FIXTURE:forge=missing", "rejected", "integrity"),
        ("FIXTURE:pickle=nofile", "rejected", "integrity"),  # said it pickled, wrote nothing
        ("FIXTURE:pickle=reply", "rejected", "integrity"),  # answered the pickle request off protocol
        ("FIXTURE:pickle=garbage", "rejected", "integrity"),  # the audit's channel carried garbage
        ("FIXTURE:pickle=extra", "rejected", "integrity"),  # facts with a key the protocol does not have
        ("FIXTURE:pickle=crash", "rejected", "integrity"),  # crashed the audit twice
    ],
)
async def test_a_forged_repl_answer_is_overruled_by_the_audit(checkers, marker, verdict, reason):
    proof = f"{GOOD} -- {marker}"
    on_its_word = await checkers(SecondLine(audit=None, trust_repl=True)).check(THEOREM, proof)
    assert on_its_word.verdict == "proved"  # what the REPL's own answers say
    judgement = await checkers(audited()).check(THEOREM, proof)
    assert (judgement.verdict, judgement.reason) == (verdict, reason), judgement


async def test_a_pickle_is_taken_so_no_later_check_can_be_served_an_earlier_one(checkers):
    checker = checkers(audited())
    assert (await checker.check(THEOREM, GOOD)).verdict == "proved"
    # Same REPL process, same theorem; this proof's REPL claims a pickle it never wrote. Had the earlier
    # proof's file stayed in /tmp, it would be audited in its place and pass.
    judgement = await checker.check(THEOREM, f"{GOOD} -- FIXTURE:pickle=nofile")
    assert (judgement.verdict, judgement.reason) == ("rejected", "integrity"), judgement
    assert "No such file" in judgement.detail


async def test_an_audit_that_cannot_start_is_an_error_never_a_verdict(checkers):
    config = ProcessSandboxConfig(argv=("/nonexistent/lean-audit",), handshake=lean_audit.AUDIT_HANDSHAKE)
    missing = SecondLine(LeanAudit(process.ProcessSandbox(config), timeout_s=5))
    for line in (missing, audited("--protocol=proofstream-audit/0")):
        judgement = await checkers(line).check(THEOREM, GOOD)
        assert judgement.verdict == "error" and "audit unavailable" in judgement.detail, judgement


async def test_without_an_audit_proved_needs_the_operators_word(checkers):
    judgement = await checkers(SecondLine(audit=None)).check(THEOREM, GOOD)
    assert judgement.verdict == "error" and "second line unavailable" in judgement.detail
    judgement = await checkers(SecondLine(audit=None, trust_repl=True)).check(THEOREM, GOOD)
    assert judgement.verdict == "proved" and "trust_repl" in judgement.detail
    # Refusals need no second line: the REPL's own objections stand.
    judgement = await checkers(SecondLine(audit=None)).check(THEOREM, f"{GOOD} -- FIXTURE:error")
    assert (judgement.verdict, judgement.reason) == ("rejected", "lean_error")


async def test_a_verdict_on_the_repls_word_is_never_cached_as_an_audited_one(checkers):
    audited_checker, trusting = checkers(audited()), checkers(SecondLine(audit=None, trust_repl=True))
    for checker in (audited_checker, trusting):
        await checker.check(THEOREM, GOOD)
    assert None not in (audited_checker.environment, trusting.environment)
    assert audited_checker.environment != trusting.environment


async def test_the_pickle_comes_out_of_a_docker_sandbox_and_is_taken(checkers):
    """The REPL in a container (the fake REPL run by the checker image's python3): the pickle in its tmpfs /tmp
    is read and removed from inside it (`docker cp` cannot see a tmpfs)."""
    if why := docker_daemon.why_unavailable(CHECKER_IMAGE):
        pytest.skip(f"docker sandbox: {why}")
    fake_repl = ("python3", "-c", FAKE_REPL.read_text())
    config = DockerSandboxConfig(image=CHECKER_IMAGE, argv=fake_repl, memory_limit_bytes=256 << 20)
    checker = LeanChecker(
        docker_backend.DockerSandbox(config), proof_timeout_s=10, header_timeout_s=10, second_line=audited()
    )
    try:
        proofs = (GOOD, f"{GOOD} -- FIXTURE:pickle=nofile", f"{GOOD} -- FIXTURE:forge=sorryAx")
        verdicts = [await checker.check(THEOREM, proof) for proof in proofs]
        expected = [("proved", ""), ("rejected", "integrity"), ("rejected", "sorry")]
        assert [(j.verdict, j.reason) for j in verdicts] == expected, verdicts
    finally:
        await checker.sandbox.kill()
        await checker.second_line.audit.sandbox.kill()


FACTS = {"imports_match": True, "kind": "theorem", "type_matches": True, "axioms": ["propext", "Quot.sound"]}


@pytest.mark.parametrize(
    "reply, verdict, reason",
    [
        ({"facts": FACTS}, "proved", ""),
        ({"facts": {**FACTS, "axioms": []}}, "proved", ""),
        ({"facts": {**FACTS, "axioms": ["propext", "sorryAx"]}}, "rejected", "sorry"),
        ({"facts": {**FACTS, "axioms": ["Lean.trustCompiler"]}}, "rejected", "integrity"),
        ({"facts": {**FACTS, "axioms": ["my_axiom"]}}, "rejected", "integrity"),
        ({"facts": {**FACTS, "kind": "axiom"}}, "rejected", "integrity"),
        ({"facts": {**FACTS, "type_matches": False}}, "rejected", "integrity"),
        ({"facts": {**FACTS, "imports_match": False}}, "rejected", "integrity"),
        ({"replay_error": "(kernel) declaration type mismatch"}, "rejected", "integrity"),
        ({"pickle_error": "failed to read file, invalid header"}, "rejected", "integrity"),
        ({"error": "the header did not elaborate"}, "error", ""),
        # outside the protocol: integrity, whatever else they say
        ({"facts": FACTS, "error": "x"}, "rejected", "integrity"),
        ({"facts": {**FACTS, "note": "ok"}}, "rejected", "integrity"),
        ({"facts": {**FACTS, "type_matches": "yes"}}, "rejected", "integrity"),
        ({"facts": {**FACTS, "axioms": [1]}}, "rejected", "integrity"),
        ({"error": {"detail": "x"}}, "rejected", "integrity"),
        ({"verdict": "proved"}, "rejected", "integrity"),
        ({}, "rejected", "integrity"),
        ([], "rejected", "integrity"),
    ],
)
def test_judge_audit(reply, verdict, reason):
    judgement = judge_audit(reply)
    assert (judgement.verdict, judgement.reason) == (verdict, reason), judgement


def test_take_file_never_follows_a_link_planted_in_tmp(tmp_path):
    """`_take_inside` through this process's own /proc/<pid>/root: a symlink in /tmp is refused, not read."""
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    link = Path(f"/tmp/proofstream-test-link-{os.getpid()}")
    link.symlink_to(secret)
    try:
        with pytest.raises(OSError):
            process._take_inside(os.getpid(), str(link), 1 << 20)
    finally:
        link.unlink(missing_ok=True)
    with pytest.raises(ValueError):
        process._take_inside(os.getpid(), "/etc/passwd", 1 << 20)


def test_settings_choose_the_second_line():
    lean = {"tasks": ["lean"], "sandbox": "process", "lean_repl_cmd": ["lake", "env", "repl"]}
    assert second_line(VerifierSettings(**lean), 0, "process").mode == "unconfirmed"
    trusting = second_line(VerifierSettings(**lean, lean_second_line="trust_repl"), 0, "process")
    assert trusting.mode == "repl-word" and trusting.trust_repl
    line = second_line(VerifierSettings(**lean, lean_audit_cmd=["lean-audit"]), 0, "process")
    assert line.mode == "audited" and line.audit.sandbox.config.argv == ("lean-audit",)
    line = second_line(VerifierSettings(**lean), 0, "docker")
    assert line.audit.sandbox.config.argv == lean_audit.AUDIT_ARGV


async def test_the_health_check_is_red_while_no_second_line_can_confirm_a_proof(redis_url, keys):
    """A Lean slot whose second line cannot confirm anything (no audit program; an audit that cannot start)
    makes every Lean proof `error`: the worker's health check names it from the start, before any proof, and
    turns green for an audit that starts."""
    repl = [sys.executable, str(FAKE_REPL)]
    # The interpreter's prefix stands in for a Lean toolchain directory: bound read-only into both sandboxes.
    fields = {
        "run": keys.run,
        "concurrency": 1,
        "tasks": ["lean"],
        "sandbox": "process",
        "lean_repl_cmd": repl,
        "lean_workdir": PROJECT_ROOT,
        "lean_toolchain_dir": sys.base_prefix,
    }
    cases = {
        "none": ({}, "no second line"),
        "missing": ({"lean_audit_cmd": ["/nonexistent/lean-audit"]}, "the audit cannot start"),
        "audit": ({"lean_audit_cmd": [sys.executable, str(FIXTURES / "fake_audit.py")]}, None),
        "trust": ({"lean_second_line": "trust_repl"}, None),
    }
    for name, (extra, why) in cases.items():
        service = VerifierService(VerifierSettings.load(env={}, flags={**fields, **extra}), redis_url)
        await service.start()
        try:
            down = service.unavailable()
            reported = service.stats()["sandboxes_unavailable"]
        finally:
            await service.stop()
        lines = {k: v for k, v in down.items() if k.endswith(":second-line")}
        if why is None:
            assert down == {}, (name, down)
        else:
            assert len(lines) == 1 and why in next(iter(lines.values())), (name, down)
            assert set(reported) == set(down)  # what ops.health reads
