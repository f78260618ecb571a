"""`python -m evals.scan_corpus` on the attributed sample of published proofs (tests/fixtures/prover_proofs,
README there): nine proofs, their verdicts read off the files by hand: two use `native_decide` (one in a
helper); three of Seed-Prover's state their theorem otherwise than ../shared/data/minif2f.jsonl does
(induction_sum_odd sums `2 * k + 1`, mathd_algebra_282 has `(1 / 3 : ℝ)`, mathd_numbertheory_780 has
`h₀ : 10 ≤ m` and no `0 ≤ x`)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import orjson
import pytest

from evals import scan_corpus

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
