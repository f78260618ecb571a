"""`python -m evals.scan_corpus` on the attributed sample of published proofs (tests/fixtures/prover_proofs,
README there): nine proofs, their verdicts read off the files by hand: two use `native_decide` (one in a
helper); three of Seed-Prover's state their theorem otherwise than data/minif2f.jsonl does
(induction_sum_odd sums `2 * k + 1`, mathd_algebra_282 has `(1 / 3 : ℝ)`, mathd_numbertheory_780 has
`h₀ : 10 ≤ m` and no `0 ≤ x`)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import orjson
import pytest

from evals import scan_corpus
from verifier_pool.judgement import Judgement
from verifier_pool.lean_check import prepare

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "prover_proofs"
RELEASES = ("kimina-prover-preview", "kimina-prover-72b", "seed-prover")
NATIVE = {
    "kimina-prover-preview": "mathd_numbertheory_12.lean",
    "kimina-prover-72b": "amc12_2001_p5.lean",
}


def run(tmp_path: Path, *releases: str) -> dict:
    out = tmp_path / "scan.json"
    assert scan_corpus.main([*(f"--release={r}" for r in releases), f"--out={out}"]) == 0
    return orjson.loads(out.read_bytes())


@pytest.mark.skipif(not scan_corpus.DATASET.exists(), reason=f"{scan_corpus.DATASET} not present")
def test_the_sample_is_accepted_but_for_native_decide_and_a_true_statement_mismatch(tmp_path):
    report = run(tmp_path, *(f"{r}={SAMPLES / r}" for r in RELEASES))
    assert report["releases"]["seed-prover"]["proofs"] == 5
    assert report["releases"]["kimina-prover-72b"]["license"].startswith("Apache-2.0")
    own, dataset = report["own_statement"], report["dataset_statement"]
    assert (own["total"], own["accepted"], own["refused_valid"]) == (9, 7, 0)
    assert own["refused_by_reason"] == {"integrity": 2}
    assert {(r["release"], r["file"], r["policy"]) for r in own["refused_proofs"]} == {
        (release, file, "native_decide") for release, file in NATIVE.items()
    }
    assert (dataset["total"], dataset["accepted"], dataset["refused_valid"]) == (9, 4, 0)
    assert dataset["refused_by_reason"] == {"integrity": 2, "statement_mismatch": 3}
    mismatches = {r["file"]: r["detail"] for r in dataset["refused_proofs"] if r["policy"] == "statement_mismatch"}
    assert sorted(mismatches) == ["induction_sum_odd.lean", "mathd_algebra_282.lean", "mathd_numbertheory_780.lean"]
    assert mismatches["mathd_numbertheory_780.lean"].endswith("line 8 of the attempt: `10` where the dataset has `0`")
    assert own["accepted_without_their_declarations"] == dataset["accepted_without_their_declarations"] == []


def test_a_release_is_read_from_its_zip_as_from_its_folder(tmp_path):
    archive = tmp_path / "seed.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted((SAMPLES / "seed-prover").glob("*.lean")):
            z.write(path, f"MiniF2F/{path.name}")
        z.writestr("__MACOSX/MiniF2F/._aime_1991_p6.lean", b"\x00\x05")  # macOS metadata, skipped
    from_zip = scan_corpus.read_release("seed-prover", archive)
    from_folder = scan_corpus.read_release("seed-prover", SAMPLES / "seed-prover")
    assert [(p.name, p.text) for p in from_zip] == [(p.name, p.text) for p in from_folder]
    assert len(from_zip) == 5


def test_a_files_own_statement_runs_from_its_keyword_to_the_assign_outside_brackets():
    text = (SAMPLES / "seed-prover" / "induction_sum_odd.lean").read_text()
    assert scan_corpus.own_statement(text, "induction_sum_odd") == (
        "theorem induction_sum_odd (n : ℕ) : (∑ k in Finset.range n, (2 * k + 1)) = n ^ 2 := by\n"
    )
    assert scan_corpus.own_statement(text, "other") is None
    default = "theorem t (x : ℕ := 2) :\n  x = 2 := rfl"  # the default value's `:=` is inside brackets
    assert scan_corpus.own_statement(default, "t") == "theorem t (x : ℕ := 2) :\n  x = 2 := by\n"


def test_a_missing_release_path_is_refused(tmp_path, capsys):
    assert scan_corpus.main([f"--release=seed-prover={tmp_path / 'nowhere'}", f"--out={tmp_path / 'o.json'}"]) == 2
    assert "NAME=PATH" in capsys.readouterr().err


# --- the 2025 releases that prove competition problems with many lemmas (README there) -----------------------

NEW = ("seed-prover-imo", "seed-prover-imo2025", "delta-prover")
# p5.lean's theorems and lemmas that no other declaration uses (read off the file with grep: each name's
# occurrences outside its own declaration and the `#print axioms` lines): its main theorems.
P5_MAIN = ["imo2025_p5_algebra_A", "imo2025_p5_algebra_B", "imo2025_p5_draw_b", "imo2025_p5_draw_a"]


def test_a_file_proves_the_theorem_its_name_names_else_those_no_declaration_uses():
    read = {(p.release, p.file, p.name) for r in NEW for p in scan_corpus.read_release(r, SAMPLES / r)}
    assert [n for _, f, n in sorted(read) if f == "p5.lean"] == sorted(P5_MAIN)
    assert ("delta-prover", "amx12a_2020_p15.lean", "amc12a_2020_p15") in read  # a misspelt file name
    # `theorem  imo1984_p2_numbertheory` (two spaces), after eight helper lemmas
    assert ("seed-prover-imo", "imo1984_p2_numbertheory.lean", "imo1984_p2_numbertheory") in read
    assert len(read) == 5 + 4 + 4
    assert scan_corpus.targets("lemma a : True := trivial\ntheorem b : True := a\n", "x") == ["b"]
    assert scan_corpus.targets("theorem b : True := trivial\n#print axioms b\n", "x") == ["b"]


def test_definitions_count_as_declarations_a_command_must_keep():
    text = "def f := 1\nabbrev g := 2\nnoncomputable def h := 3\ninstance : Inhabited F := ⟨1⟩\n-- lemma x\n"
    assert scan_corpus._declarations(text + "theorem t : f = 1 := rfl\n") == 5
    # one `def f` and 23 lemmas and theorems, each at the start of a line (grep -c)
    assert scan_corpus._declarations((SAMPLES / "seed-prover-imo" / "imo_2001_p4.lean").read_text()) == 24


def test_the_new_releases_refusals_that_are_right_are_named_by_their_policy(tmp_path):
    empty = tmp_path / "none.jsonl"
    empty.write_text("")
    out = tmp_path / "scan.json"
    specs = [f"--release={r}={SAMPLES / r}" for r in NEW]
    assert scan_corpus.main([*specs, f"--dataset={empty}", f"--out={out}"]) == 0
    report = orjson.loads(out.read_bytes())
    assert report["releases"]["seed-prover-imo2025"]["files"] == 1
    assert report["releases"]["seed-prover-imo2025"]["proofs"] == 4
    assert report["releases"]["delta-prover"]["license"].startswith("Apache-2.0")
    own = report["own_statement"]
    assert own["total"] == 13
    refused = {r["file"]: r["policy"] for r in own["refused_proofs"]}
    assert refused["imo2000_p2_algebra.lean"] == "code_or_syntax_definition"  # `elab "negate_push" : tactic`
    assert refused["imo_2001_p4.lean"] == "statement_uses_file_definitions"  # `def f`, the statement's `f n a`
    assert refused["amx12a_2020_p15.lean"] == "sorry_in_file"  # `:= by sorry`
    # Delta Prover's `mkOpaque` is its own tactic: refused, if at all, as such (the scan does not know tactics)
    assert refused.get("mathd_numbertheory_618.lean", "release_runtime") == "release_runtime"
    assert "imo1984_p2_numbertheory.lean" not in refused
    assert "amc12a_2009_p6.lean" not in refused
    assert own["accepted_without_their_declarations"] == []
    figures = own["by_release"]["seed-prover-imo"]
    assert figures["total"] == figures["accepted"] + figures["refused"] == 5
    assert report["dataset_statement"]["total"] == 0  # none of them is in the dataset


@pytest.mark.parametrize(
    ("release", "file", "theorem"),
    [
        ("delta-prover", "mathd_numbertheory_66.lean", "mathd_numbertheory_66"),  # `noncomputable section`
        # a named argument of non-literal value on the line after `:=`: a term, not configuration
        ("delta-prover", "amc12a_2009_p6.lean", "amc12a_2009_p6"),
        # `#print axioms` of another theorem after it; between the lemmas
        ("seed-prover-imo", "imo1964_p1b_numbertheory.lean", "imo1964_p1b_numbertheory"),
        *(("seed-prover-imo2025", "p5.lean", name) for name in P5_MAIN),
        # a `| inr` alternative after an empty line, the line above ending in `)` (one symbol token within a line)
        ("seed-prover-imo", "imo_1997_p5.lean", "imo_1997_p5"),
    ],
)
def test_a_valid_proof_of_a_2025_release_is_accepted_with_its_helpers(release, file, theorem):
    text = (SAMPLES / release / file).read_text()
    statement = scan_corpus.own_statement(text, theorem)
    command = prepare(text, statement)
    assert isinstance(command, str), command
    # every declaration up to the target's statement, and the target; what follows its proof is dropped
    head = text[: text.index(statement.split(":", 1)[0])]
    assert scan_corpus._declarations(command) == scan_corpus._declarations(head) + 1


def test_a_def_helper_the_checked_command_lost_is_reported_as_dropped(monkeypatch):
    text = "noncomputable def g (n : ℕ) : ℕ := n + 1\n\ntheorem t : g 1 = 2 := by\n  rfl\n"
    statement = "theorem t : g 1 = 2 := by\n"
    # a front end that keeps the theorem and loses the `def` its proof needs (Lean would then fail it)
    monkeypatch.setattr(scan_corpus, "prepare", lambda model_text, formal, **_: formal + "  rfl\n")
    report = scan_corpus.scan([scan_corpus.Proof("r", "t.lean", "t", text)], {("t.lean", "t"): statement})
    assert report["accepted"] == 1
    assert report["accepted_without_their_declarations"] == [
        {"release": "r", "file": "t.lean", "theorem": "t", "declarations": 1, "in_file": 2}
    ]
    assert report["by_release"]["r"]["accepted_without_their_declarations"] == 1


def test_a_refusal_is_right_by_policy_only_where_the_file_gives_a_reason():
    refusal = Judgement("rejected", "integrity", "before the statement: forbidden: def (a new command)")
    text = "namespace P\ndef play (n : ℕ) : ℕ := n\ndef Foo.card (n : ℕ) : ℕ := n\nend P\n"

    def verdict(statement: str, release: str = "r", body: str = "") -> str | None:
        return scan_corpus.policy(refusal, scan_corpus.Proof(release, "f.lean", "t", text + body), statement)

    assert verdict("theorem t : play 1 = 1 := by\n") == "statement_uses_file_definitions"
    assert verdict("theorem t : P.play 1 = 1 := by\n") == "statement_uses_file_definitions"
    assert verdict("theorem t (s : Finset ℕ) : s.card = Finset.card s := by\n") is None  # not `Foo.card`
    assert verdict("theorem t : 1 = 1 := by\n", body="theorem t : 1 = 1 := by sorry\n") == "sorry_in_file"
    # in a helper the first refusal did not reach: it goes with the proof all the same
    assert verdict("theorem t : 1 = 1 := by\n", body="lemma h : 2 = 2 := by native_decide\n") == "native_decide"
    assert verdict("theorem t : 1 = 1 := by\n", body="lemma h : 2 = 2 := by decide +native\n") == "native_decide"
    assert verdict("theorem t : 1 = 1 := by\n", "delta-prover", "theorem t : 1 = 1 := by\n  mkOpaque\n") == (
        "release_runtime"
    )
    assert verdict("theorem t : 1 = 1 := by\n", "r", "theorem t : 1 = 1 := by\n  mkOpaque\n") is None
    elab = Judgement("rejected", "integrity", "before the statement: forbidden: elab")
    assert scan_corpus.policy(elab, scan_corpus.Proof("r", "f", "t", ""), "theorem t : True := by\n") == (
        "code_or_syntax_definition"
    )
