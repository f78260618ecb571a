"""The Lean path end to end on the real Lean image: step 5 of the Lean box recipe (ops/deploy/lean_box.sh).

The cases are the integrity tests' own exploit texts (tests/verifier_pool/test_lean_check.py's EXPLOITS, in the
proof; test_lean_commands.py's EXPLOITS_BEFORE, before the statement), imported from them, never copied, and the
published provers' proofs in tests/fixtures/prover_proofs, plus a smoke proof and a proof Lean itself refuses. On a
machine with the image (PROOFSTREAM_LEAN_BOX_IMAGE names it) each goes through `LeanChecker` on the docker backend
with the audit as the second line, as the verifier builds it (verifier_pool.pool): the smoke proof must be `proved`
(the REPL, the pickle and lean-audit all work), no exploit may be (but for a trailing `#print axioms` of the
target, which the front end drops, leaving a sound proof), no verdict may be `error`, and the samples' verdicts are
recorded (their authors checked them on Lean v4.14/v4.15 and an older Mathlib; a lemma renamed since is a Lean
error, not ours). The figures (proofs/s per core, memory per REPL, audit time) go to PROOFSTREAM_LEAN_BOX_OUT as
JSON. The verifier's settings are its own (PROOFSTREAM_<FIELD> from the environment: memory_limit_mb,
recycle_memory_mb, proof_timeout_s, ...), the CPU share of each sandbox PROOFSTREAM_LEAN_BOX_CPUS (default 1).
Without the image the listing is checked, and step 5's own code is rehearsed on a stand-in image whose `lean-repl`
and `lean-audit` are the test doubles: nothing here runs Lean."""

from __future__ import annotations

import asyncio
import io
import json
import os
import platform
import re
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from evals import scan_corpus
from streams.theorems import Theorem
from tasks.lean import DEFAULT_HEADER
from tests.verifier_pool.sandboxes import FAKE_REPL, FIXTURES, NO_DOCKER
from tests.verifier_pool.sandboxes import IMAGE as CHECKER_IMAGE
from tests.verifier_pool.test_lean_check import EXPLOITS, EXPLOITS_AFTER_THE_PROOF
from tests.verifier_pool.test_lean_commands import EXPLOITS_BEFORE, GCD, NAME, SAMPLES

IMAGE = os.environ.get("PROOFSTREAM_LEAN_BOX_IMAGE", "")
OUT = os.environ.get("PROOFSTREAM_LEAN_BOX_OUT", "")
CPUS = float(os.environ.get("PROOFSTREAM_LEAN_BOX_CPUS", "1"))
# Refused by policy before Lean (tests/fixtures/prover_proofs/README.md): they use native_decide.
NATIVE_DECIDE = {"kimina-prover-preview/mathd_numbertheory_12.lean", "kimina-prover-72b/amc12_2001_p5.lean"}


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # smoke | lean_refuses | exploit | sample
    theorem: Theorem
    text: str  # the model's attempt
    expect: str  # proved | rejected | recorded (a sample that goes to Lean: its verdict is a figure)


def expect_before(before: str) -> str:
    """An exploit before the statement is refused, except a bare `namespace Nat` left open: with the audit as
    second line the theorem goes to Lean closed out of it under `open Nat in`, and a statement that names
    `Nat.gcd` in full reads the same there, so the sound proof after it is proved (and the audit would refuse
    any statement that read otherwise)."""
    return "proved" if before == "namespace Nat\n" else "rejected"


def cases() -> list[Case]:
    """Every case of the box run, in its order: the smoke proof first (it also elaborates the header once)."""
    gcd = Theorem(NAME, "lean", statement=GCD, header=DEFAULT_HEADER)
    listed = [
        Case("smoke: Nat.gcd 180 168 = 12 by norm_num", "smoke", gcd, f"{GCD}  norm_num\n", "proved"),
        Case("Lean refuses: a false step", "lean_refuses", gcd, f"{GCD}  exact (rfl : (1 : ℕ) = 2)\n", "rejected"),
    ]
    listed += [
        Case(f"exploit in the proof #{i}: {r}", "exploit", gcd, f"{GCD}{body}", "rejected")
        for i, (body, r) in enumerate(EXPLOITS)
    ]
    # after a sound proof: the front end drops the command and all after it (test_lean_check.py,
    # test_an_exploit_after_the_proof_never_reaches_lean), and the proof left is proved, as the box shows on Lean
    listed += [
        Case(f"exploit after the proof #{i}: {r}", "exploit", gcd, f"{GCD}  norm_num\n{after}", "proved")
        for i, (after, r) in enumerate(EXPLOITS_AFTER_THE_PROOF)
    ]
    listed += [
        Case(
            f"exploit before the statement #{i}: {d}",
            "exploit",
            gcd,
            f"{before}{GCD}  norm_num\n",
            expect_before(before),
        )
        for i, (before, d) in enumerate(EXPLOITS_BEFORE)
    ]
    for path in sorted(SAMPLES.rglob("*.lean")):
        relative = str(path.relative_to(SAMPLES))
        text = path.read_text()
        # each target theorem of the file with its own statement, as evals.scan_corpus measures them (a file's
        # name may name none: Seed's IMO 2025 p5.lean proves several, Delta's amx12a_2020_p15 amc12a_2020_p15)
        names = scan_corpus.targets(text, path.stem)
        for name in names:
            theorem = Theorem(name, "lean", statement=scan_corpus.own_statement(text, name), header=DEFAULT_HEADER)
            expect = "rejected" if relative in NATIVE_DECIDE else "recorded"
            label = f"sample: {relative}" if names == [path.stem] else f"sample: {relative} {name}"
            listed.append(Case(label, "sample", theorem, text, expect))
    return listed


def test_the_box_runs_every_exploit_of_the_integrity_tests_and_every_published_sample():
    listed = cases()
    assert len({c.name for c in listed}) == len(listed)  # each verdict can be told apart in the record
    exploits = [c for c in listed if c.kind == "exploit"]
    assert len(exploits) == len(EXPLOITS) + len(EXPLOITS_AFTER_THE_PROOF) + len(EXPLOITS_BEFORE) > 30
    samples = [c.name.removeprefix("sample: ") for c in listed if c.kind == "sample"]
    files = sorted(str(p.relative_to(SAMPLES)) for p in SAMPLES.rglob("*.lean"))
    assert sorted({name.split(" ", 1)[0] for name in samples}) == files  # every file, each of its targets
    assert len(samples) >= 9 and set(samples) >= NATIVE_DECIDE  # the fixture may grow (issue 38, item 3)
    assert listed[0].kind == "smoke" and listed[0].expect == "proved"
    # what the box measures: the smoke proof, Lean's own refusal, the accepted samples and the harmless
    # "exploits" (commands after the proof, dropped; a namespace left open) reach Lean; the other exploits and
    # the native_decide samples are refused before it (the box checks the real checker refuses them too)
    assert {c.kind for c in listed if goes_to_lean(c)} == {"smoke", "lean_refuses", "sample", "exploit"}
    reaching = [c for c in listed if c.kind == "exploit" and goes_to_lean(c)]
    assert [(c.name, c.expect) for c in reaching] == [(c.name, "proved") for c in listed if c.expect == "proved"][1:]
    after = [c.name for c in listed if c.name.startswith("exploit after the proof")]
    assert [c.name for c in reaching] == [*after, next(c.name for c in reaching if "before the statement" in c.name)]
    assert [c.name for c in listed if c.expect == "rejected" and goes_to_lean(c)] == ["Lean refuses: a false step"]


def goes_to_lean(case: Case) -> bool:
    """Whether the verifier's front end sends the case to Lean (else it is refused before any Lean time)."""
    from verifier_pool.lean_check import prepare  # noqa: PLC0415

    # the box's LeanChecker has the audit as its second line: a theorem inside its namespace goes to Lean
    return isinstance(prepare(case.text, case.theorem.statement, header=case.theorem.header, open_namespaces=True), str)


def repl_memory_bytes(sandbox_id: str) -> int | None:
    """The memory of the running container of `sandbox_id` (memcg, as the recycle threshold reads it)."""
    from verifier_pool import docker_daemon  # noqa: PLC0415 - the docker SDK, only on the box

    client = docker_daemon.connect(None, 10.0)
    found = client.containers.list(filters={"label": f"{docker_daemon.LABEL_SANDBOX_ID}={sandbox_id}"})
    return docker_daemon.memory_bytes(found[0]) if found else None


async def run_box(image: str) -> dict:
    """Each case through the verifier's own Lean checker on `image`; the verdicts and the figures."""
    from verifier_pool.config import VerifierSettings  # noqa: PLC0415 - on the box only
    from verifier_pool.pool import make_checkers  # noqa: PLC0415

    version = image.rsplit(":", 1)[-1]
    settings = VerifierSettings(
        sandbox="docker", tasks=["lean"], lean_image=image, lean_toolchain=f"{version}+mathlib", cpus=CPUS
    )
    checker = make_checkers(settings, 0, {"lean": "docker"})["lean"]
    audit = checker.second_line.audit
    assert audit is not None, "the docker backend builds the audit as the second line"
    audit_s: list[float] = []
    judge = audit.audit

    async def timed_audit(theorem, pickle):
        start = time.perf_counter()
        try:
            return await judge(theorem, pickle)
        finally:
            audit_s.append(time.perf_counter() - start)

    audit.audit = timed_audit
    records = []
    try:
        start = time.perf_counter()
        await checker.sandbox.start()
        repl_start_s = time.perf_counter() - start
        for case in cases():
            start = time.perf_counter()
            judgement = await checker.check(case.theorem, case.text)
            records.append((case, judgement, time.perf_counter() - start))
        memory = repl_memory_bytes(checker.sandbox.sandbox_id)
        starts = checker.sandbox.stats().starts
    finally:
        await checker.sandbox.kill()
        await audit.sandbox.kill()
    record = figures(image, records, repl_start_s, audit_s, memory)
    limits = {"memory_limit_mb": settings.memory_limit_mb, "recycle_memory_mb": settings.recycle_memory_mb}
    return {**record, "repl_starts": starts, **limits}


def figures(image: str, records: list, repl_start_s: float, audit_s: list[float], memory: int | None) -> dict:
    """The record: every verdict, and proofs/s per core over the checks that reached Lean after the first (which
    elaborates the header), memory per REPL, audit time."""
    reached = [s for case, _, s in records[1:] if goes_to_lean(case)]
    return {
        "image": image,
        "cpus_per_sandbox": CPUS,
        "host": platform.node(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "repl_start_s": round(repl_start_s, 2),
        "first_check_s (header elaboration included)": round(records[0][2], 2),
        "checks_reaching_lean": len(reached),
        "proofs_per_s_per_core": round(len(reached) / sum(reached) / CPUS, 4) if reached else None,
        "repl_memory_mb": round(memory / 2**20) if memory else None,
        "audits": len(audit_s),
        "audit_s_mean": round(sum(audit_s) / len(audit_s), 2) if audit_s else None,
        "audit_s_max": round(max(audit_s), 2) if audit_s else None,
        "verdicts": [
            {
                "case": c.name,
                "expect": c.expect,
                "verdict": j.verdict,
                "reason": j.reason,
                "s": round(s, 2),
                "detail": j.detail[:300],
            }
            for c, j, s in records
        ],
    }


@pytest.mark.timeout(7200)  # the header (`import Mathlib`, up to header_timeout_s) and each proof's own limit
@pytest.mark.skipif(not IMAGE, reason="needs the Lean image: ops/deploy/lean_box.sh sets PROOFSTREAM_LEAN_BOX_IMAGE")
def test_the_lean_path_end_to_end_on_the_image():
    record = asyncio.run(run_box(IMAGE))
    if OUT:
        Path(OUT).mkdir(parents=True, exist_ok=True)
        name = f"lean-box-{IMAGE.rsplit(':', 1)[-1]}-{record['date']}.json"
        (Path(OUT) / name).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    verdicts = record["verdicts"]
    assert [v for v in verdicts if v["verdict"] == "error"] == []  # the infrastructure never decides a verdict
    assert verdicts[0]["verdict"] == "proved", verdicts[0]  # REPL, pickle and lean-audit all work
    wrong = [v for v in verdicts if v["expect"] in ("proved", "rejected") and v["verdict"] != v["expect"]]
    assert wrong == []
    assert record["audits"] >= 1 and record["audit_s_mean"] is not None


# --- the box run rehearsed here, on a stand-in for the Lean image --------------------------------------------

STAND_IN = "proofstream-lean-stand-in:rehearsal"


def build_stand_in() -> str:
    """An image like the Lean image to the verifier (`lean-repl`, `lean-audit` on PATH, uid 10001) whose two
    programs are the test doubles: the synthetic REPL and the fake audit, over the checker image's python3."""
    files = {
        "Dockerfile": f"FROM {CHECKER_IMAGE}\nCOPY stand-in /opt/stand-in\nCOPY bin/ /usr/local/bin/\n",
        "stand-in/ops/bench/synthetic_repl.py": FAKE_REPL.read_text(),
        "stand-in/tests/fixtures/fake_audit.py": (FIXTURES / "fake_audit.py").read_text(),
        "bin/lean-repl": '#!/bin/sh\nexec python3 /opt/stand-in/ops/bench/synthetic_repl.py "$@"\n',
        "bin/lean-audit": '#!/bin/sh\nexec python3 /opt/stand-in/tests/fixtures/fake_audit.py "$@"\n',
    }
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.startswith("bin/") else 0o644
            tar.addfile(info, io.BytesIO(data))
    subprocess.run(
        ["docker", "build", "-q", "-t", STAND_IN, "-"],
        input=context.getvalue(),
        capture_output=True,
        check=True,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
        timeout=120,
    )
    return STAND_IN


@pytest.mark.timeout(300)
@pytest.mark.skipif(NO_DOCKER is not None, reason=f"needs Docker and the checker image: {NO_DOCKER}")
def test_the_box_run_rehearsed_on_a_stand_in_image():
    """Step 5's own code (the checker as the verifier builds it, the timed audits, the memory reading, the
    record) run here on the docker backend, with the doubles answering for Lean: what it shows is the plumbing,
    never Lean's verdicts (the synthetic REPL proves whatever reaches it)."""
    try:
        record = asyncio.run(run_box(build_stand_in()))
    finally:
        subprocess.run(["docker", "image", "rm", "-f", STAND_IN], capture_output=True, timeout=60)
    verdicts = {v["case"]: v for v in record["verdicts"]}
    assert [v for v in verdicts.values() if v["verdict"] == "error"] == []
    for case in cases():
        expected = "proved" if goes_to_lean(case) else "rejected"  # the doubles prove all that reaches them
        assert verdicts[case.name]["verdict"] == expected, verdicts[case.name]
    reaching = sum(goes_to_lean(c) for c in cases())
    assert record["audits"] == reaching  # one audit, in a fresh sandbox, per proof the REPL accepted
    assert record["checks_reaching_lean"] == reaching - 1  # the first one elaborates the header: apart
    assert record["proofs_per_s_per_core"] > 0 and record["audit_s_mean"] > 0
    assert record["repl_memory_mb"] is not None and 0 < record["repl_memory_mb"] < 512
    assert record["repl_starts"] == 1  # one REPL for the whole run: every check after the first reused its header


# --- the recipe itself ---------------------------------------------------------------------------------------

RECIPE = Path(__file__).resolve().parents[2] / "ops" / "deploy" / "lean_box.sh"
LEAN_PINS = "ops/deploy/images/lean/check_pins.sh"


def test_the_recipe_names_its_five_steps_in_order():
    result = subprocess.run(["bash", str(RECIPE), "--dry-run"], capture_output=True, text=True, check=True)
    steps = re.findall(r"^lean-box: step (\d) \(([^)]+)\): (.*)$", result.stdout, re.M)
    assert [(n, name) for n, name, _ in steps] == [
        ("1", "the cases"),
        ("2", "the pins"),
        ("3", "the base image"),
        ("4", "the Lean image"),
        ("5", "the Lean path"),
    ]
    assert steps[1][2].endswith("check_pins.sh v4.28.0 v4.2.3")  # the Dockerfile's pins
    assert "PROOFSTREAM_LEAN_BOX_IMAGE=proofstream-lean:v4.28.0" in steps[4][2]


def test_without_github_the_recipe_stops_at_the_pins_and_says_so(tmp_path):
    """Step 2 is the first that needs the network: where GitHub cannot be asked (here a file:// URL that leads
    nowhere stands in for it), the recipe says so in one line and runs nothing after it."""
    env = {**os.environ, "GIT_BASE": f"file://{tmp_path}/nowhere", "OUT": str(tmp_path / "out")}
    result = subprocess.run(["bash", str(RECIPE), "--from", "2"], capture_output=True, text=True, env=env)
    assert result.returncode == 3
    assert result.stdout.splitlines() == [f"lean-box: step 2 (the pins): sh {LEAN_PINS} v4.28.0 v4.2.3"]
    assert result.stderr.splitlines()[-1].startswith(
        "lean-box: stopped at step 2 (the pins): it needs GitHub, which this machine cannot reach;"
    )
    assert not (tmp_path / "out").exists()
