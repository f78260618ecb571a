"""The trainer's problems: Lean theorem files in the field's formats, a held-out split, and Countdown.

Everything here is pure Python (no torch) and returns `streams.theorems.Theorem`, the canonical record the
verifier checks against. Loaders return a `Problems` list: a plain `list[Theorem]` with a `meta` side table
(theorem_id -> {"split", "format", "where", ...}) for what a Theorem does not carry (a dataset's own split,
a Countdown problem's known solution).

Formats `load_jsonl` reads, detected per line (one JSON object a line; a file whose first character is `[`
is read as one JSON array, the way Lean Workbook ships `lean_workbook.json`):

- miniF2F / ProofNet (DeepSeek-Prover-V1.5 `datasets/*.jsonl`, the copies in ../shared/data): `name`, `split`,
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

A statement whose header is missing gets `DEFAULT_HEADER`. Every Lean statement is normalised to end in
":= by\\n" (a trailing `sorry` dropped, " by" appended after a bare ":="), which is what the verifier's
statement-integrity check requires, and must name its theorem (`theorem NAME` / `lemma NAME`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streams.theorems import Theorem
from verifier_pool.lean_check import assemble, extract_proof_body, theorem_name
from verifier_pool.lean_text import lex

if TYPE_CHECKING:
    from trainer.config import TrainerSettings

EXAMPLES = Path(__file__).resolve().parent / "examples" / "lean_examples.jsonl"

DEFAULT_HEADER = (
    "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\nopen BigOperators Real Nat Topology Rat\n\n"
)


class Problems(list):
    """A `list[Theorem]` with `meta`: theorem_id -> dict of what the Theorem does not carry.

    `skipped` lists the rows a loader skipped on request. Keys a loader may set in `meta`: "split" (the
    dataset's own, when it has one), "format" ("minif2f", "lean_workbook", "stp", "formal_statement",
    "countdown"), "where" ("file:line"), "original_id" (before `duplicates="disambiguate"`), and for Countdown
    "solution" (an expression over the numbers that equals the target)."""

    def __init__(self, items: Iterable[Theorem] = (), meta: Mapping[str, dict[str, Any]] | None = None):
        super().__init__(items)
        self.meta: dict[str, dict[str, Any]] = dict(meta or {})
        self.skipped: list[str] = []  # "file:line: why", for rows a loader was told to skip


# --- Lean files -----------------------------------------------------------------------------------------

_FENCE = "```lean4"
_HEADER_LINE = re.compile(r"^\s*(?:$|import\s|set_option\s|open\s|--)")
_DOC_COMMENT = re.compile(r"\A\s*(/-[-!].*?-/)[ \t]*\n?", re.DOTALL)
_TRAILING_SORRY = re.compile(r"(:=\s*(?:by)?)\s*sorry\s*\Z")
_ENDS_BY = re.compile(r":=\s*by\s*\Z")
_ENDS_ASSIGN = re.compile(r":=\s*\Z")


class DataError(ValueError):
    """A malformed line or file, named by file:line."""


class _NotATheorem(DataError):
    """A well-formed row whose statement declares no theorem (e.g. a `def`)."""


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
        except _NotATheorem as e:
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
    if "numbers" in row:
        return _countdown_row(row, where)
    if "formal_statement" in row:
        fmt = "minif2f" if "informal_prefix" in row or "goal" in row else "formal_statement"
        if "natural_language_statement" in row:
            fmt = "lean_workbook"
        statement = _text(row, "formal_statement", where)
        header = row.get("header") or ""
        if not isinstance(header, str):
            raise DataError(f"{where}: `header` must be a string")
        informal = ""
        for key in ("informal_prefix", "natural_language_statement", "informal_statement", "informal_stmt"):
            if isinstance(row.get(key), str) and row[key].strip():
                informal = row[key]
                break
        ident = row.get("name") or row.get("id") or row.get("problem_id")
        return _lean(ident, header, statement, informal, where), {"format": fmt, "split": row.get("split")}
    if "prompt" in row:
        return _stp_row(row, where)
    keys = ", ".join(sorted(map(str, row))[:8]) or "none"
    raise DataError(
        f"{where}: unknown row format (keys: {keys}); expected `formal_statement` (miniF2F, Lean Workbook), "
        "`prompt` (STP) or `numbers` + `target` (Countdown)"
    )


def _countdown_row(row: dict, where: str) -> tuple[Theorem, dict[str, Any]]:
    numbers, target = row.get("numbers"), row.get("target")
    if not isinstance(numbers, list) or not numbers or not all(type(n) is int for n in numbers):
        raise DataError(f"{where}: Countdown `numbers` must be a non-empty list of integers")
    if type(target) is not int:
        raise DataError(f"{where}: Countdown `target` must be an integer")
    ident = row.get("id") or row.get("name")
    if not isinstance(ident, str) or not ident.strip():
        ident = f"cd-{'-'.join(map(str, numbers))}-{target}"
    meta: dict[str, Any] = {"format": "countdown", "split": row.get("split")}
    if isinstance(row.get("solution"), str):
        meta["solution"] = row["solution"]
    return Theorem(ident.strip(), "countdown", numbers=list(numbers), target=target), meta


def _text(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: `{key}` must be a non-empty string")
    return value


def _stp_row(row: dict, where: str) -> tuple[Theorem, dict[str, Any]]:
    prompt = _text(row, "prompt", where)
    if _FENCE not in prompt:
        raise DataError(f"{where}: STP `prompt` has no ```lean4 block")
    code = prompt.split(_FENCE, 1)[1]
    code = code[1:] if code.startswith("\n") else code
    if code.rstrip().endswith("```"):
        code = code.rstrip()[:-3]
    lines = code.splitlines(keepends=True)
    n = 0
    while n < len(lines) and _HEADER_LINE.match(lines[n]):
        n += 1
    header, rest = "".join(lines[:n]), "".join(lines[n:])
    informal = ""
    doc = _DOC_COMMENT.match(rest)
    if doc:
        informal, rest = doc.group(1) + "\n", rest[doc.end() :]
    if "<hard theorem>" in rest or "<easy theorem>" in rest:
        raise DataError(f"{where}: an STP conjecturing prompt, not a theorem to prove")
    ident = row.get("name") or row.get("id")
    meta = {"format": "stp", "split": row.get("split"), "tag": row.get("tag")}
    return _lean(ident, header, rest, informal, where), meta


def _lean(ident: Any, header: str, statement: str, informal: str, where: str) -> Theorem:
    statement = _canonical_statement(statement)
    try:
        name = theorem_name(statement)
    except ValueError:
        raise _NotATheorem(f"{where}: no `theorem NAME` in the statement: {statement.strip()[:60]!r}") from None
    if ident is not None and not isinstance(ident, str | int):
        raise DataError(f"{where}: the theorem id must be a string")
    theorem_id = str(ident).strip() if ident is not None and str(ident).strip() else name
    if not header.strip():
        header = DEFAULT_HEADER
    elif not header.endswith("\n"):
        header += "\n"
    if why := lean_problem(statement, header):
        raise DataError(f"{where}: {why}")
    return Theorem(theorem_id, "lean", statement=statement, header=header, informal=informal)


@functools.lru_cache(maxsize=64)  # a dataset shares a handful of headers among thousands of rows
def _header_problem(header: str) -> str | None:
    """Why the verifier could not elaborate `header` as the REPL's first command, or None. Checked: it lexes
    as Lean does (no unterminated comment or string, no literal whose reading depends on Lean's version)."""
    for token in lex(header):
        where = f"header line {token.line}"
        if token.kind == "ambiguous":
            return f"{where}: a literal Lean may read differently by version: {token.text[:40]!r}"
        if token.kind == "comment" and token.text.startswith("/-") and not token.text.endswith("-/"):
            return f"{where}: a block comment that never ends (it would swallow the statement)"
        if token.kind == "string" and (len(token.text) < 2 or not token.text.endswith('"')):
            return f"{where}: a string that never ends"
    return None


def lean_problem(statement: str, header: str) -> str | None:
    """Why the verifier could not check proofs of this theorem, or None: found when the theorems are loaded,
    not as an error on every attempt. For a statement that names its theorem (`_lean` reads the name first):
    it must assemble into the checked command (verifier_pool.lean_check.assemble) and be found again in a
    model's text that restates it (else every proof would be rejected as altering it); the header must lex
    (`_header_problem`)."""
    try:
        if "import" in statement:  # assemble's other rule, ending in `by`, extract_proof_body checks too
            assemble(statement, "  rfl\n")
        body = extract_proof_body(f"{statement}  rfl\n", statement)  # ~0.14 ms a statement
    except ValueError as e:
        return str(e)
    if not isinstance(body, str) or body.strip() != "rfl":
        return f"the verifier does not find the statement again in a proof that restates it: {statement[:80]!r}"
    return _header_problem(header)


def _canonical_statement(statement: str) -> str:
    """The statement ending in ':= by' and a newline: a trailing `sorry` dropped, ' by' after a bare ':='."""
    text = _TRAILING_SORRY.sub(r"\1", statement.rstrip())
    if _ENDS_BY.search(text):
        return text + "\n"
    if _ENDS_ASSIGN.search(text):
        return text + " by\n"
    return text + " := by\n"


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


# --- Countdown ------------------------------------------------------------------------------------------

CURRICULA = (None, "easy", "ramp")
_OPS = ("+", "-", "*", "/")


def countdown_problems(
    count: int,
    seed: int,
    *,
    numbers: tuple[int, int] = (2, 4),
    max_number: int = 20,
    max_target: int = 100,
    curriculum: str | None = None,
) -> Problems:
    """`count` solvable Countdown problems, ids "cd-<seed>-<i>", each with its solution in `meta[id]`.

    A problem draws k numbers in 1..max_number and builds a random expression over all of them, combining two
    values at a time with + - * / where every intermediate result is a positive integer (a - b only when
    a > b, a / b only when b > 1 divides a); the target is its value, kept when 1 <= target <= max_target
    and not one of the numbers (otherwise redrawn). So every problem is solvable and `meta[id]["solution"]`
    passes `verifier_pool.countdown.check`.

    numbers: (fewest, most) numbers per problem, inclusive. curriculum:
      None: k uniform in that range.
      "easy": k in 2..3 (within the range) and only + - *: the default 135M model needs problems it can
        sometimes solve (DESIGN.md, "The offline task").
      "ramp": k grows with the index, from the fewest for the first problems to the most for the last.
    Problem i depends only on (seed, i, the parameters): a longer list extends a shorter one (except with
    "ramp", whose sizes depend on `count`).
    """
    lo, hi = numbers
    if not 1 <= lo <= hi:
        raise ValueError(f"numbers must be (fewest, most) with 1 <= fewest <= most, not {numbers}")
    if curriculum not in CURRICULA:
        raise ValueError(f"curriculum must be one of {CURRICULA}, not {curriculum!r}")
    if max_number < 2 or max_target < 1:
        raise ValueError("max_number must be >= 2 and max_target >= 1")
    ops = _OPS
    if curriculum == "easy":
        if lo > 3:
            raise ValueError(f"curriculum 'easy' has 2-3 numbers; numbers={numbers} allows none")
        lo, hi, ops = max(lo, 2), min(hi, 3), ("+", "-", "*")
    out = Problems()
    for i in range(count):
        rng = random.Random(f"proofstream-countdown:{seed}:{i}")
        k = lo + min(hi - lo, (hi - lo + 1) * i // max(count, 1)) if curriculum == "ramp" else rng.randint(lo, hi)
        nums, target, solution = _draw(rng, k, max_number, max_target, ops)
        theorem_id = f"cd-{seed}-{i}"
        out.append(Theorem(theorem_id, "countdown", numbers=nums, target=target))
        out.meta[theorem_id] = {"format": "countdown", "solution": solution, "split": None}
    return out


def _draw(rng: random.Random, k: int, max_number: int, max_target: int, ops: tuple[str, ...]):
    for _ in range(10_000):
        nums = [rng.randint(1, max_number) for _ in range(k)]
        pool = [(n, str(n)) for n in nums]
        while len(pool) > 1:
            a, b = pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))
            pool.append(_combine(rng, a, b, ops))
        value, expr = pool[0]
        if 1 <= value <= max_target and (k == 1 or value not in nums):
            return nums, value, _strip_outer(expr)
    raise RuntimeError(f"no {k}-number problem with a target in 1..{max_target} found; raise max_target")


def _combine(rng: random.Random, a: tuple[int, str], b: tuple[int, str], ops: tuple[str, ...]):
    (x, ex), (y, ey) = (a, b) if a[0] >= b[0] else (b, a)  # x >= y
    choices = [op for op in ops if (op != "-" or x > y) and (op != "/" or (y > 1 and x % y == 0))]
    op = rng.choice(choices)  # "+" and "*" always qualify
    if op in "+*" and rng.random() < 0.5:  # commutative: either order reads fine
        (x, ex), (y, ey) = (y, ey), (x, ex)
    value = {"+": x + y, "-": x - y, "*": x * y, "/": x // max(y, 1)}[op]
    return value, f"({ex} {op} {ey})"


def _strip_outer(expr: str) -> str:
    return expr[1:-1] if expr.startswith("(") and expr.endswith(")") else expr


def load_theorems(settings: TrainerSettings) -> tuple[list[Theorem], list[Theorem]]:
    """(train, held-out) for the task: seeded Countdown problems, or a Lean jsonl (the shipped examples
    when no dataset is named)."""
    if settings.task == "countdown":
        curriculum = None if settings.curriculum == "none" else settings.curriculum
        problems = countdown_problems(settings.problems + settings.held_out, settings.seed, curriculum=curriculum)
        return problems[settings.held_out :], problems[: settings.held_out]
    path = Path(settings.dataset) if settings.dataset else EXAMPLES
    theorems = load_jsonl(path)
    fraction = settings.held_out / len(theorems) if len(theorems) > settings.held_out else 0.0
    return held_out_split(theorems, fraction, settings.seed)
