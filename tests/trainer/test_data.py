"""trainer.data with the tasks' row parsers (tasks.lean, tasks.countdown): the field's formats, the held-out split."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tasks.countdown import countdown_problems
from tasks.countdown_check import check
from tasks.lean import DEFAULT_HEADER
from tasks.lean_proof import theorem_name
from tasks.problems import DataError
from trainer import data
from trainer.data import held_out_split, load_jsonl

SHARED = Path(__file__).resolve().parents[2] / "data"  # the copies kept in the repository (data/README.md)
MINIF2F = SHARED / "minif2f.jsonl"
PROOFNET = SHARED / "proofnet.jsonl"
MINIF2F_HEADER = (
    "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 0\n\nopen BigOperators Real Nat Topology Rat\n\n"
)

needs_minif2f = pytest.mark.skipif(not MINIF2F.exists(), reason=f"{MINIF2F} not present")
needs_proofnet = pytest.mark.skipif(not PROOFNET.exists(), reason=f"{PROOFNET} not present")


def write_lines(tmp_path: Path, rows: list, name: str = "rows.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows))
    return path


# --- miniF2F / ProofNet, the real files --------------------------------------------------------------------


@needs_minif2f
def test_minif2f_loads_every_problem_with_its_header_and_split():
    problems = load_jsonl(MINIF2F)
    assert len(problems) == 488
    assert len({t.theorem_id for t in problems}) == 488
    raw = [json.loads(line) for line in MINIF2F.read_text().splitlines()]
    for t, row in zip(problems, raw, strict=True):
        assert t.task == "lean" and t.theorem_id == row["name"]
        assert t.statement == row["formal_statement"]  # already canonical: kept byte for byte
        assert t.header == row["header"] == MINIF2F_HEADER
        assert t.informal == row["informal_prefix"]
        assert theorem_name(t.statement) == row["name"]
        assert problems.meta[t.theorem_id]["split"] == row["split"]
    assert sum(m["split"] == "test" for m in problems.meta.values()) == 244


@needs_minif2f
def test_split_and_limit_filter_rows():
    test = load_jsonl(MINIF2F, split="test")
    assert len(test) == 244 and {test.meta[t.theorem_id]["split"] for t in test} == {"test"}
    assert len(load_jsonl(MINIF2F, split=("valid", "test"))) == 488
    first = load_jsonl(MINIF2F, split="valid", limit=5)
    assert [t.theorem_id for t in first] == [t.theorem_id for t in load_jsonl(MINIF2F, split="valid")[:5]]


@needs_proofnet
def test_proofnet_duplicate_names_and_definitions_are_errors_unless_asked(tmp_path):
    with pytest.raises(DataError, match=r"proofnet\.jsonl:76: no `theorem NAME`.*skip_non_theorems"):
        load_jsonl(PROOFNET)
    with pytest.raises(DataError, match=r"proofnet\.jsonl:41: duplicate theorem id 'exercise_3_3'.*:11\)"):
        load_jsonl(PROOFNET, skip_non_theorems=True)
    problems = load_jsonl(PROOFNET, duplicates="disambiguate", skip_non_theorems=True)
    assert len(problems.skipped) == 14 and all("def" in s for s in problems.skipped)
    assert len(problems) == 371 - 14 == len({t.theorem_id for t in problems})
    renamed = [t for t in problems if "@" in t.theorem_id]
    assert renamed and all(problems.meta[t.theorem_id]["original_id"] == t.theorem_id.split("@")[0] for t in renamed)
    for t in problems:  # ProofNet statements end in ":=", the verifier needs ":= by"
        assert t.statement.endswith(":= by\n") and t.header.startswith("import Mathlib")
    # the disambiguated ids do not depend on the order of the file
    reversed_file = PROOFNET.read_text().splitlines()[::-1]
    again = load_jsonl(write_lines(tmp_path, reversed_file), duplicates="disambiguate", skip_non_theorems=True)
    assert {t.theorem_id for t in again} == {t.theorem_id for t in problems}


def test_shipped_examples_are_easy_minif2f_theorems():
    examples = load_jsonl(data.EXAMPLES)
    assert 6 <= len(examples) <= 10
    for t in examples:
        assert t.task == "lean" and t.theorem_id.startswith("mathd_")
        assert t.statement.startswith(f"theorem {t.theorem_id} ") and t.statement.endswith(":= by\n")
        assert t.header == MINIF2F_HEADER and t.informal.startswith("/--")
    assert {examples.meta[t.theorem_id]["split"] for t in examples} == {"valid", "test"}
    if MINIF2F.exists():  # copied verbatim
        lines = set(MINIF2F.read_text().splitlines())
        assert all(line in lines for line in data.EXAMPLES.read_text().splitlines())


# --- Lean Workbook and STP, on fixture lines in their published shapes ---------------------------------------

WORKBOOK_ROW = {  # lean_workbook.json (a JSON array of these)
    "natural_language_statement": "Prove that $29\\cdot31+37-41\\equiv 3\\pmod{4}$",
    "answer": "3",
    "tags": ["number_theory"],
    "formal_statement": "theorem lean_workbook_18 :\n  (29 * 31 + 37 - 41) % 4 = 3  :=  by sorry",
    "split": "lean_workbook",
    "proof": ["norm_num"],
}
WORKBOOK_PARQUET_ROW = {  # the Hub's wkbk_1009.parquet view, as jsonl
    "id": "lean_workbook_plus_2",
    "status": "proved",
    "tactic": "nlinarith [sq_nonneg (x - 1)]",
    "state_before": "x : ℝ\n⊢ 0 ≤ (x - 1) ^ 2",
    "state_after": "no goals",
    "natural_language_statement": "Show that $(x-1)^2 \\ge 0$.",
    "answer": "",
    "formal_statement": "theorem lean_workbook_plus_2 (x : ℝ) : 0 ≤ (x - 1) ^ 2 := by sorry",
}
STP_HEADER = "import Mathlib\nimport Aesop\nset_option maxHeartbeats 0\nopen BigOperators Real Nat Topology Rat\n"
STP_ROW = {
    "prompt": "Complete the following Lean 4 code:\n\n```lean4\n"
    + STP_HEADER
    + "\n/-- Show that 2 + 2 = 4. -/\ntheorem lean_workbook_plus_7 : (2 : ℕ) + 2 = 4 := by",
    "target": "\n  norm_num\n```",
    "tag": "['leanworkbook']",
}


def test_lean_workbook_rows_get_the_default_header_and_a_canonical_statement(tmp_path):
    path = write_lines(tmp_path, [WORKBOOK_ROW, WORKBOOK_PARQUET_ROW])
    a, b = load_jsonl(path)
    assert a.theorem_id == "lean_workbook_18"  # no id field: the theorem's own name
    assert a.statement == "theorem lean_workbook_18 :\n  (29 * 31 + 37 - 41) % 4 = 3  :=  by\n"
    assert a.header == DEFAULT_HEADER and a.informal == WORKBOOK_ROW["natural_language_statement"]
    assert b.theorem_id == "lean_workbook_plus_2" and b.statement.endswith("(x - 1) ^ 2 := by\n")
    problems = load_jsonl(path)
    assert problems.meta["lean_workbook_18"] | {"where": None} == {
        "format": "lean_workbook",
        "split": "lean_workbook",
        "where": None,
    }
    assert problems.meta["lean_workbook_plus_2"]["where"] == f"{path}:2"


def test_lean_workbook_json_array_file(tmp_path):
    path = tmp_path / "lean_workbook.json"
    rows = [WORKBOOK_ROW, dict(WORKBOOK_ROW, formal_statement="theorem lean_workbook_19 : True := by sorry")]
    path.write_text(json.dumps(rows, indent=2))
    problems = load_jsonl(path)
    assert [t.theorem_id for t in problems] == ["lean_workbook_18", "lean_workbook_19"]
    assert problems.meta["lean_workbook_19"]["where"] == f"{path}[1]"
    assert load_jsonl(path, split="lean_workbook_plus") == []


def test_stp_prompt_is_split_into_header_docstring_and_statement(tmp_path):
    no_header = dict(STP_ROW, prompt="Complete the following Lean 4 code:\n\n```lean4\ntheorem t2 : 1 = 1 := by")
    problems = load_jsonl(write_lines(tmp_path, [STP_ROW, no_header]))
    t, u = problems
    assert t.theorem_id == "lean_workbook_plus_7"
    assert t.header == STP_HEADER + "\n"
    assert t.informal == "/-- Show that 2 + 2 = 4. -/\n"
    assert t.statement == "theorem lean_workbook_plus_7 : (2 : ℕ) + 2 = 4 := by\n"
    assert problems.meta[t.theorem_id]["format"] == "stp" and problems.meta[t.theorem_id]["tag"] == "['leanworkbook']"
    assert u.theorem_id == "t2" and u.header == DEFAULT_HEADER


def test_stp_repeats_one_row_per_proof_and_disambiguate_collapses_them(tmp_path):
    second_proof = dict(STP_ROW, target="\n  simp\n```")
    path = write_lines(tmp_path, [STP_ROW, second_proof])
    with pytest.raises(
        DataError, match=rf"{path}:2: duplicate theorem id 'lean_workbook_plus_7' \(first at {path}:1\)"
    ):
        load_jsonl(path)
    problems = load_jsonl(path, duplicates="disambiguate")
    assert [t.theorem_id for t in problems] == ["lean_workbook_plus_7"]


def test_countdown_rows(tmp_path):
    path = write_lines(tmp_path, [{"numbers": [3, 5, 7], "target": 22, "id": "cd-x", "solution": "3 * 5 + 7"}])
    (t,) = problems = load_jsonl(path)
    assert (t.theorem_id, t.task, t.numbers, t.target) == ("cd-x", "countdown", [3, 5, 7], 22)
    assert check(t.numbers, t.target, problems.meta["cd-x"]["solution"]).ok


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]\n", "expected a JSON object"),
        ('{"question": "2+2?"}', "unknown row format"),
        ('{"formal_statement": ""}', "`formal_statement` must be a non-empty string"),
        ('{"formal_statement": "example : True := by"}', "no `theorem NAME`"),
        ('{"formal_statement": "theorem x : True := by", "header": 3}', "`header` must be a string"),
        ('{"prompt": "prove it"}', "no ```lean4 block"),
        ('{"numbers": [1, "2"], "target": 3}', "list of integers"),
        ('{"numbers": [1, 2], "target": "3"}', "`target` must be an integer"),
        # Statements and headers the verifier could not check, refused at load instead of on every attempt.
        ('{"formal_statement": "theorem x : True := /- by"}', "does not end with ':= by'"),
        ('{"formal_statement": "import Mathlib\\ntheorem x : True := by"}', "not a canonical statement"),
        (
            '{"formal_statement": "theorem x : True := by", "header": "import Mathlib\\n/- note\\n"}',
            "header line 2: a block comment that never ends",
        ),
        (
            '{"formal_statement": "theorem x : True := by", "header": "import Mathlib\\nopen \\"Real\\n"}',
            "header line 2: a string that never ends",
        ),
    ],
)
def test_a_malformed_line_is_an_error_naming_file_and_line(tmp_path, line, message):
    good = {"name": "ok", "formal_statement": "theorem ok : True := by\n", "header": MINIF2F_HEADER}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + line + "\n")  # a blank line in between is allowed
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:3: .*{re.escape(message)}"):
        load_jsonl(path)


def test_duplicate_ids_are_an_error(tmp_path):
    row = {"name": "dup", "formal_statement": "theorem dup : True := by\n", "header": MINIF2F_HEADER}
    path = write_lines(
        tmp_path, [row, dict(row, name="other"), dict(row, formal_statement="theorem dup : 1 = 1 := by")]
    )
    with pytest.raises(DataError, match=rf"{path}:3: duplicate theorem id 'dup' \(first at {path}:1\)"):
        load_jsonl(path)
    ids = [t.theorem_id for t in load_jsonl(path, duplicates="disambiguate")]
    assert len(ids) == 3 and ids[1] == "other" and all(i.startswith("dup@") for i in (ids[0], ids[2]))


# --- held-out split ----------------------------------------------------------------------------------------


def _fake(n: int) -> list:
    return countdown_problems(n, 3)


def test_split_is_deterministic_stable_under_reordering_and_per_item():
    items = _fake(400)
    train, held = held_out_split(items, 0.25, seed=1)
    assert len(train) + len(held) == 400 and 60 < len(held) < 140  # about a quarter
    assert (train, held) == held_out_split(items, 0.25, seed=1)
    r_train, r_held = held_out_split(list(reversed(items)), 0.25, seed=1)
    assert {t.theorem_id for t in r_held} == {t.theorem_id for t in held}
    assert r_held == held[::-1]  # input order kept within each side
    # membership depends on the theorem alone: a growing dataset never moves a held-out theorem into training
    _, held_small = held_out_split(items[:100], 0.25, seed=1)
    assert {t.theorem_id for t in held_small} == {t.theorem_id for t in held} & {t.theorem_id for t in items[:100]}
    _, other_seed = held_out_split(items, 0.25, seed=2)
    assert {t.theorem_id for t in other_seed} != {t.theorem_id for t in held}
    assert held_out_split(items, 0.0, seed=1) == (items, [])
    assert held_out_split(items, 1.0, seed=1) == ([], items)
    with pytest.raises(ValueError):
        held_out_split(items, 1.5, seed=1)


@needs_minif2f
def test_split_by_the_datasets_own_field():
    problems = load_jsonl(MINIF2F)
    train, held = held_out_split(problems, 0.5, seed=0, by_field="split")
    assert len(train) == len(held) == 244
    assert {problems.meta[t.theorem_id]["split"] for t in held} == {"test"}
    train2, held2 = held_out_split(list(problems)[::-1], 0.9, 5, by_field="split", meta=problems.meta)
    assert {t.theorem_id for t in held2} == {t.theorem_id for t in held}
    with pytest.raises(ValueError, match="needs `meta`"):
        held_out_split(list(problems), 0.5, 0, by_field="split")
    with pytest.raises(ValueError, match="no 'source' field"):
        held_out_split(problems, 0.5, 0, by_field="source")


def test_pure_python_no_torch():
    import subprocess
    import sys

    code = "import sys, trainer.data; assert 'torch' not in sys.modules, 'trainer.data imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_the_paper_preset_scores_countdown_the_papers_way_and_its_problems_say_so():
    from trainer.config import TrainerSettings
    from trainer.data import load_theorems

    assert TrainerSettings.load(env={}, flags={}).reward == "shaped"  # the cpu preset's
    paper = TrainerSettings.load(env={}, flags={"preset": "paper", "problems": 4, "held_out": 2})
    assert paper.reward == "paper" and paper.model_dump()["reward"] == "paper"  # run.json's settings
    assert TrainerSettings.load(env={}, flags={"preset": "paper", "reward": "shaped"}).reward == "shaped"
    train, held_out = load_theorems(paper)
    assert {t.reward for t in train + held_out} == {"paper"}  # the verifier scores each by its record
    shaped_train, _ = load_theorems(TrainerSettings.load(env={}, flags={"problems": 4, "held_out": 2}))
    assert {t.reward for t in shaped_train} == {""} and b'"reward"' not in shaped_train[0].encode()  # as before
