"""The trainer's problems: dataset files in the field's formats, a held-out split, and which problems a run uses.

Each row's task module parses it (tasks.lean, tasks.countdown; this module reads the files, picks a row's
task from its keys and keeps the ids unique), and every loader returns `streams.theorems.Theorem`, the
canonical record the verifier checks against, in a `tasks.problems.Problems` list: a plain `list[Theorem]`
with a `meta` side table (theorem_id -> {"split", "format", "where", ...}) for what a Theorem does not carry
(a dataset's own split, a Countdown problem's known solution). Countdown problems are also drawn, seeded
(tasks.countdown.countdown_problems).

Formats `load_jsonl` reads, detected per line (one JSON object a line; a file whose first character is `[`
is read as one JSON array, the way Lean Workbook ships `lean_workbook.json`):

- miniF2F / ProofNet (DeepSeek-Prover-V1.5 `datasets/*.jsonl`, the copies in data/): `name`, `split`,
  `informal_prefix` (a `/-- ... -/` doc comment), `formal_statement`, `goal`, `header`. miniF2F statements end
  in ":= by\\n"; ProofNet's end in ":=" and get " by" appended. Verified on the files themselves.
- Lean Workbook (internlm/Lean-Workbook). The canonical `lean_workbook.json` is a JSON array of objects with
  `natural_language_statement`, `answer`, `tags`, `formal_statement` (ending "  :=  by sorry"), `split`
  ("lean_workbook" | "lean_workbook_plus") and `proof` (a list, often empty); no id and no header (the
  theorem name, `lean_workbook_N`, is the id). The Hub's parquet view (`wkbk_1009.parquet`) and datasets
  derived from it have `id`, `status`, `tactic`, `state_before`, `state_after`, `natural_language_statement`,
  `answer`, `formal_statement`. Verified (searched, not downloaded) from: a write-up that parsed the live file
  (row counts 57,321 + 82,893, the six keys, an example row); InternLM/InternLM-Math `leanworkbook/` (the
  README points to the HF dataset; `header.lean` is its Lean 4.8 import list); the dataset card of
  pkuAI4M/RAG_lean_wkbk_6 (the parquet feature list above); several public loaders that read
  `formal_statement` / `natural_language_statement` / `proof` / `split` and strip the trailing `sorry`.
- STP (Dong & Ma 2025, kfdong/STP_Lean_0320, kfdong/STP_Lean_SFT): rows are SFT pairs, `prompt` and
  `target` (plus bookkeeping such as `tag`, e.g. "['conjecture']"). `prompt` is
  "Complete the following Lean 4 code:\\n\\n```lean4\\n" + header + statement, where the statement ends in
  ":= by" and the header is the row's own or STP's default ("import Mathlib\\nimport Aesop\\nset_option
  maxHeartbeats 0\\nopen BigOperators Real Nat Topology Rat\\n"); `target` is the proof. Verified from STP's
  prompt builder (`get_prompt` / `PROVER_PROMPT` in utils/model_utils.py of the STP code, as forked in
  nick-rui/STP-GPU) and public loaders of STP_Lean_0320 that split `prompt` at the ```lean4 fence and read
  `target` as the proof. The same statement appears once per published proof: load with
  `duplicates="disambiguate"` to keep one record per statement.
- Any other object with `formal_statement` (+ optional `header`, `name`/`id`, `split`) is read the same way.
- Countdown: `numbers` (a list of ints) and an integer `target`, optional `id` and `solution`.

A statement whose header is missing gets `tasks.lean.DEFAULT_HEADER`. Every Lean statement is normalised to end in
":= by\\n" (a trailing `sorry` dropped, " by" appended after a bare ":="), which is what the verifier's
statement-integrity check requires, and must name its theorem (`theorem NAME` / `lemma NAME`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streams.theorems import Theorem
from tasks import countdown, lean
from tasks.problems import DataError, Problems

if TYPE_CHECKING:
    from trainer.config import TrainerSettings

EXAMPLES = Path(__file__).resolve().parent / "examples" / "lean_examples.jsonl"

# --- dataset files --------------------------------------------------------------------------------------


def load_jsonl(
    path: str | Path,
    *,
    split: str | Collection[str] | None = None,
    limit: int | None = None,
    duplicates: str = "error",
    skip_non_theorems: bool = False,
) -> Problems:
    """The problems in `path`, in file order, as canonical `Theorem` records (formats: the module docstring).

    split: keep only rows whose own `split` field is this value (or one of these values).
    limit: stop after this many kept rows.
    duplicates: "error" (default): a theorem id seen twice is a DataError naming both lines.
        "disambiguate": rows repeating an id with the same statement and header (STP publishes one row per
        proof) collapse to the first; ids shared by different statements (ProofNet reuses exercise numbers
        across textbooks) all become "<id>@<8 hex of sha256(header + statement)>", stable under reordering.
    skip_non_theorems: a statement without `theorem NAME` / `lemma NAME` (ProofNet has 14 `def`s that build
        data, which the verifier cannot check as proofs) is skipped and listed in `.skipped` instead of
        being a DataError.
    """
    if duplicates not in ("error", "disambiguate"):
        raise ValueError(f"duplicates must be 'error' or 'disambiguate', not {duplicates!r}")
    wanted = {split} if isinstance(split, str) else (set(split) if split is not None else None)
    path = Path(path)
    kept: list[tuple[Theorem, dict[str, Any]]] = []
    skipped: list[str] = []
    for where, row in _rows(path):
        if limit is not None and len(kept) >= limit:
            break
        if wanted is not None and str(row.get("split", "")) not in wanted:
            continue
        try:
            theorem, meta = _parse_row(row, where)
        except lean.NotATheorem as e:
            if not skip_non_theorems:
                raise DataError(f"{e} (pass skip_non_theorems=True to skip such rows)") from None
            skipped.append(str(e))
            continue
        meta["where"] = where
        kept.append((theorem, meta))
    problems = _unique(kept, duplicates)
    problems.skipped = skipped
    return problems


def _rows(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        head = f.read(4096).lstrip()
        f.seek(0)
        if head.startswith("["):  # one JSON array (Lean Workbook's lean_workbook.json)
            try:
                doc = json.load(f)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from e
            if not isinstance(doc, list):
                raise DataError(f"{path}:1: a JSON file must hold an array of objects")
            for i, row in enumerate(doc):
                yield f"{path}[{i}]", _object(row, f"{path}[{i}]")
            return
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from e
            yield where, _object(row, where)


def _object(row: Any, where: str) -> dict:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return row


def _parse_row(row: dict, where: str) -> tuple[Theorem, dict[str, Any]]:
    """The row's task and format, from its keys; the task module reads it."""
    if "numbers" in row:
        return countdown.parse_row(row, where)
    if "formal_statement" in row:
        return lean.formal_statement_row(row, where)
    if "prompt" in row:
        return lean.stp_row(row, where)
    keys = ", ".join(sorted(map(str, row))[:8]) or "none"
    raise DataError(
        f"{where}: unknown row format (keys: {keys}); expected `formal_statement` (miniF2F, Lean Workbook), "
        "`prompt` (STP) or `numbers` + `target` (Countdown)"
    )


def _unique(kept: list[tuple[Theorem, dict[str, Any]]], duplicates: str) -> Problems:
    first: dict[str, int] = {}
    groups: dict[str, list[int]] = {}
    for i, (t, meta) in enumerate(kept):
        if t.theorem_id in first and duplicates == "error":
            other = kept[first[t.theorem_id]][1]["where"]
            raise DataError(
                f"{meta['where']}: duplicate theorem id {t.theorem_id!r} (first at {other}); "
                "pass duplicates='disambiguate' to keep one record per distinct statement"
            )
        first.setdefault(t.theorem_id, i)
        groups.setdefault(t.theorem_id, []).append(i)
    out = Problems()
    renamed: dict[str, tuple[str, str]] = {}  # new id -> (header, statement), to catch digest collisions
    for i, (t, meta) in enumerate(kept):
        members = groups[t.theorem_id]
        if len(members) == 1:
            out.append(t)
            out.meta[t.theorem_id] = meta
            continue
        distinct = {(kept[j][0].header, kept[j][0].statement) for j in members}
        if len(distinct) == 1:  # the same problem repeated (one row per proof): keep the first
            if i == members[0]:
                out.append(t)
                out.meta[t.theorem_id] = meta
            continue
        digest = hashlib.sha256((t.header + t.statement).encode()).hexdigest()[:8]
        new_id = f"{t.theorem_id}@{digest}"
        if new_id in renamed:
            if renamed[new_id] == (t.header, t.statement):
                continue  # a repeat of a statement already kept under its disambiguated id
            raise DataError(f"{meta['where']}: id {new_id!r} collides; rename the theorem in the file")
        renamed[new_id] = (t.header, t.statement)
        out.append(Theorem(new_id, t.task, t.statement, t.header, t.informal, list(t.numbers), t.target))
        out.meta[new_id] = {**meta, "original_id": t.theorem_id}
    return out


# --- held-out split -------------------------------------------------------------------------------------


def held_out_split(
    theorems: Iterable[Theorem],
    fraction: float,
    seed: int,
    *,
    by_field: str | None = None,
    held_out_values: Collection[str] = ("test",),
    meta: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[list[Theorem], list[Theorem]]:
    """(train, held_out), each in input order. Deterministic, no shuffling.

    Default: a theorem is held out iff u(seed, theorem_id) < fraction, where u is a sha256 of the seed and
    the id read as a number in [0, 1). Membership depends on nothing else: not the input order, not the other
    theorems, so a held-out theorem stays held out when the dataset grows (no leak into training across
    runs). The held-out count is therefore about fraction * n, not exactly that.

    by_field="split": use the dataset's own split instead (miniF2F's valid/test): held out iff the theorem's
    `meta[id][by_field]` is in `held_out_values`; `fraction` and `seed` are ignored. The field comes from
    `meta`, or from the `Problems.meta` of what `load_jsonl` returned; a theorem without it is an error.
    """
    items = list(theorems)
    if by_field is not None:
        table = meta if meta is not None else getattr(theorems, "meta", None)
        if table is None:
            raise ValueError(f"by_field={by_field!r} needs `meta` (or the Problems that load_jsonl returned)")
        values = set(held_out_values)
        missing = [t.theorem_id for t in items if (table.get(t.theorem_id) or {}).get(by_field) is None]
        if missing:
            raise ValueError(f"{len(missing)} theorems have no {by_field!r} field, e.g. {missing[0]!r}")
        held = [str(table[t.theorem_id][by_field]) in values for t in items]
    else:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], not {fraction}")
        held = [_unit(seed, t.theorem_id) < fraction for t in items]
    train = [t for t, h in zip(items, held, strict=True) if not h]
    return train, [t for t, h in zip(items, held, strict=True) if h]


def _unit(seed: int, theorem_id: str) -> float:
    digest = hashlib.sha256(f"proofstream-split:{seed}:{theorem_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def load_theorems(settings: TrainerSettings) -> tuple[list[Theorem], list[Theorem]]:
    """(train, held-out) for the task: seeded Countdown problems (scored by the run's `reward`), or a Lean jsonl
    (the shipped examples when no dataset is named)."""
    if settings.task == "countdown":
        curriculum = None if settings.curriculum == "none" else settings.curriculum
        count = settings.problems + settings.held_out
        problems = countdown.countdown_problems(count, settings.seed, curriculum=curriculum)
        if settings.reward == "paper":  # the verifier scores by the record's scheme (streams/theorems.py)
            problems = [dataclasses.replace(t, reward="paper") for t in problems]
        return problems[settings.held_out :], problems[: settings.held_out]
    path = Path(settings.dataset) if settings.dataset else EXAMPLES
    theorems = load_jsonl(path)
    fraction = settings.held_out / len(theorems) if len(theorems) > settings.held_out else 0.0
    return held_out_split(theorems, fraction, settings.seed)
