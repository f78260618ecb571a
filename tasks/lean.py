"""The Lean task: prompt formats, what of a completion is the attempt, and the problem loaders.

Prompt formats, as the provers were trained on them (their model cards):
- `kimina`: Kimina-Prover. System "You are an expert in mathematics and Lean 4."; the user asks to think
  and solve step by step, gives the problem in words (when known) and the formal statement, header
  included, inside a ```lean4 block.
- `deepseek`: DeepSeek-Prover-V2. One user turn: "Complete the following Lean 4 code:" with the statement in
  a ```lean4 block, then the request for a proof plan before the code.

Extraction: the reasoning comes first (a `<think>...</think>` block, or plain prose), the code last. The
attempt is the last ```lean4 block after the reasoning, exactly as the model wrote it: the statement it
contains is kept as given, and the verifier checks it against the canonical one (integrity), never this
module. A generation cut off inside its final block keeps what it has (the verifier judges it).

Loaders (trainer.data reads the files and picks a row's task): formats, as verified on the datasets
themselves or their published loaders (trainer.data's docstring lists them and the sources):
- miniF2F / ProofNet / Lean Workbook / any row with `formal_statement` (+ optional `header`, `name`/`id`,
  `split`, an informal statement): `formal_statement_row`.
- STP (kfdong/STP_Lean_0320): `prompt` = "Complete the following Lean 4 code:\\n\\n```lean4\\n" + header +
  statement, `target` the proof: `stp_row`.
A statement whose header is missing gets `DEFAULT_HEADER`. Every statement is normalised to end in ":= by\\n"
(a trailing `sorry` dropped, " by" appended after a bare ":="), which is what the verifier's
statement-integrity check requires, and must name its theorem (`theorem NAME` / `lemma NAME`). The proof's
place in a model's text (shared with the verifier) is tasks.lean_proof; the lexer is tasks.lean_text.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from streams.theorems import Theorem
from tasks import after_reasoning
from tasks.lean_proof import assemble, code_block, extract_proof_body, theorem_name
from tasks.lean_text import lex
from tasks.problems import DataError

LEAN_FORMATS = ("kimina", "deepseek")
KIMINA_SYSTEM = "You are an expert in mathematics and Lean 4."
DEEPSEEK_PLAN = (
    "Before producing the Lean 4 code to formally prove the given theorem, provide a detailed proof plan "
    "outlining the main proof steps and strategies.\nThe plan should highlight key ideas, intermediate lemmas, "
    "and proof structures that will guide the construction of the final formal proof."
)
DEFAULT_HEADER = (
    "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\nopen BigOperators Real Nat Topology Rat\n\n"
)

_INFORMAL_COMMENT = re.compile(r"^\s*/--(.*?)-/\s*$", re.DOTALL)

_STP_FENCE = "```lean4"
_HEADER_LINE = re.compile(r"^\s*(?:$|import\s|set_option\s|open\s|--)")
_DOC_COMMENT = re.compile(r"\A\s*(/-[-!].*?-/)[ \t]*\n?", re.DOTALL)
_TRAILING_SORRY = re.compile(r"(:=\s*(?:by)?)\s*sorry\s*\Z")
_ENDS_BY = re.compile(r":=\s*by\s*\Z")
_ENDS_ASSIGN = re.compile(r":=\s*\Z")


# --- prompt and attempt ---------------------------------------------------------------------------------


def messages(theorem: Theorem, fmt: str = "kimina") -> list[dict[str, str]]:
    """The chat messages that ask for a proof of `theorem` in prompt format `fmt`."""
    code = f"{theorem.header}{theorem.statement}".rstrip("\n")
    if fmt == "kimina":
        problem = _informal_text(theorem.informal)
        prompt = "Think about and solve the following problem step by step in Lean 4."
        prompt += f"\n# Problem:{problem}"
        prompt += f"\n# Formal statement:\n```lean4\n{code}\n```\n"
        return [{"role": "system", "content": KIMINA_SYSTEM}, {"role": "user", "content": prompt}]
    if fmt == "deepseek":
        prompt = f"Complete the following Lean 4 code:\n\n```lean4\n{code}\n```\n\n{DEEPSEEK_PLAN}"
        return [{"role": "user", "content": prompt}]
    raise ValueError(f"unknown Lean prompt format {fmt!r}: use one of {', '.join(LEAN_FORMATS)}")


def _informal_text(informal: str) -> str:
    """miniF2F keeps the problem as a `/-- ... -/` doc comment; the prompt wants the words."""
    m = _INFORMAL_COMMENT.match(informal or "")
    return (m.group(1) if m else informal or "").strip()


def extract_lean(text: str) -> str:
    """The attempt in a Lean completion: the last ```lean4 (or ```lean, or untagged) block after the
    reasoning; else the code after an unclosed ```lean4 fence (cut off by the token limit); else ""
    (the model wrote no code: the verifier rejects the empty attempt)."""
    for region in (after_reasoning(text), text):  # a model that put its code inside the reasoning is judged
        block = code_block(region, first_word=True)  # the info line's first word names the language
        if block is not None:
            return block.strip("\n")
    return ""


# --- problems -------------------------------------------------------------------------------------------


class NotATheorem(DataError):
    """A well-formed row whose statement declares no theorem (e.g. a `def`)."""


def formal_statement_row(row: dict, where: str) -> tuple[Theorem, dict[str, Any]]:
    """A row with `formal_statement` (miniF2F, ProofNet, Lean Workbook, others) -> (Theorem, meta)."""
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
    return lean_theorem(ident, header, statement, informal, where), {"format": fmt, "split": row.get("split")}


def _text(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: `{key}` must be a non-empty string")
    return value


def stp_row(row: dict, where: str) -> tuple[Theorem, dict[str, Any]]:
    """An STP row (`prompt` holding the header and statement in a ```lean4 block) -> (Theorem, meta)."""
    prompt = _text(row, "prompt", where)
    if _STP_FENCE not in prompt:
        raise DataError(f"{where}: STP `prompt` has no ```lean4 block")
    code = prompt.split(_STP_FENCE, 1)[1]
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
    return lean_theorem(ident, header, rest, informal, where), meta


def lean_theorem(ident: Any, header: str, statement: str, informal: str, where: str) -> Theorem:
    """The canonical record of a Lean problem; DataError (NotATheorem) when the verifier could not check it."""
    statement = _canonical_statement(statement)
    try:
        name = theorem_name(statement)
    except ValueError:
        raise NotATheorem(f"{where}: no `theorem NAME` in the statement: {statement.strip()[:60]!r}") from None
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
    not as an error on every attempt. For a statement that names its theorem (`lean_theorem` reads the name
    first): it must assemble into the checked command (tasks.lean_proof.assemble) and be found again in a
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
