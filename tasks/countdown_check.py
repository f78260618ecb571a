"""The Countdown checker: the program the sandbox runs (`python -m tasks.countdown_check`), stdlib only.

A separate file from tasks/countdown.py because it runs alone: inside a sandbox that holds the standard
library, this file and the package's import-free `__init__` (the process sandbox binds tasks/, the checker
image copies the two files), so it imports nothing of ours; its own bytes are the digest that joins the
verdict cache key. What the rest of the task needs from it (the `<answer>` reading, `check`, the partial
credit) tasks/countdown.py imports from here, so each rule exists once.

Countdown is the offline task of the ES-at-scale paper (Qiu et al. 2025; TinyZero's format). A problem is a
list of numbers and a target; an answer is an arithmetic expression over + - * / and parentheses that uses
each given number exactly once and equals the target. The checker never calls `eval`: it walks a Python `ast`
of the expression, admitting only number literals and the four operators, and computes with exact fractions
(so 7/2*2 is 7, not 7.000000001).

`run_checker` answers JSON requests framed like the Lean REPL's (one JSON object, then a blank line), so the
Countdown task goes through the same sandboxes, timeouts and verdicts as Lean. A request holds one job
(`{"countdown": job}`) or several (`{"countdown_batch": [job, ...]}`, answered `{"results": [reply, ...]}` in
order): a check takes well under a millisecond, so one exchange per job would leave the sandbox waiting on
the worker's event loop between jobs about as long as it works
(verifier_pool.checkers.CountdownChecker.check_many).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

# The handshake (verifier_pool.repl.Handshake): the sandbox asks it right after start; the reply names the
# checker and the digest of the code that judges, which joins the verdict cache key, so an edited checker
# (in the checkout, or rebuilt into an image) never serves an old verdict.
HANDSHAKE_REQUEST = {"handshake": "countdown"}
HANDSHAKE_REPLY = {"checker": "countdown"}
with open(__file__, "rb") as _source:
    CHECKER_DIGEST = hashlib.sha256(_source.read()).hexdigest()[:16]

MAX_BATCH = 64  # jobs in one batch request; the worker sends at most its read batch (16 by default)
MAX_EXPRESSION_CHARS = 200  # a longer "expression" is not an answer to a 3-6 number problem
EXCERPT_CHARS = 40  # the model's words in a detail: one JSON-quoted line, cut here
# A refusal's rule, the first word of its detail: the only part of a detail that tools count as a category.
RULES = ("format", "syntax", "equation", "numbers", "value")
MAX_STATED = 3  # "3 * 4 = 12": sides after the expression, each an expression its value must equal
OPEN_TAG, CLOSE_TAG = "<answer>", "</answer>"


@dataclass(frozen=True, slots=True)
class CountdownResult:
    ok: bool
    reason: str  # "" | "format" | "numbers" | "value" | "syntax" | "equation"
    detail: str
    value: float | None = None


def last_tagged(text: str, ignore_case: bool = False) -> str | None:
    """What `re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)[-1]` returns (None for no match), in
    time linear in len(text) with five searches. With `ignore_case`, that regex with re.IGNORECASE (which also
    folds `ſ` to `s` and `K` to `k`): how the generator finds an answer (tasks.countdown.extract_countdown,
    which hands the checker lowercase tags); the checker's own reading, and its format credit, keep the case.

    The regex is quadratic on untrusted text: every unclosed `<answer>` is a start from which `.*?` scans to
    the end (a 1 MB attempt of them ran past the checker's timeout). The searches rely on the two tags never
    overlapping (each has its only `<` at offset 0). findall pairs an opener with the first closer after
    it and resumes after that closer, so the last match closes at the first closer after the last opener
    that still has a closer after it (`last_open`); it opens at the first opener after the last closer
    before `last_open` (no match can end between that closer and `last_open`, and none holds it)."""
    last, first = (_last_folded, _first_folded) if ignore_case else (_last_exact, _first_exact)
    last_close = last(text, CLOSE_TAG, len(text))
    last_open = last(text, OPEN_TAG, last_close) if last_close >= 0 else -1
    if last_open < 0:
        return None
    close = first(text, CLOSE_TAG, last_open + len(OPEN_TAG))
    before = last(text, CLOSE_TAG, last_open)
    start = first(text, OPEN_TAG, before + len(CLOSE_TAG) if before >= 0 else 0)
    return text[start + len(OPEN_TAG) : close]


# The two searches of `last_tagged`, each answering the start of `tag` or -1: the last one wholly before `end`,
# the first one from `start`. Folded: a regex search for the first, and `.*` anchored at the start, whose
# backtracking from the end finds the last (re.IGNORECASE matches one character to one, so a found tag is
# len(tag) long).
_FOLDED = {tag: re.compile(re.escape(tag), re.IGNORECASE) for tag in (OPEN_TAG, CLOSE_TAG)}
_FOLDED_LAST = {tag: re.compile(r"(?s:.*)" + re.escape(tag), re.IGNORECASE) for tag in (OPEN_TAG, CLOSE_TAG)}


def _last_exact(text: str, tag: str, end: int) -> int:
    return text.rfind(tag, 0, end)


def _first_exact(text: str, tag: str, start: int) -> int:
    return text.find(tag, start)


def _last_folded(text: str, tag: str, end: int) -> int:
    m = _FOLDED_LAST[tag].match(text, 0, end)
    return -1 if m is None else m.end() - len(tag)


def _first_folded(text: str, tag: str, start: int) -> int:
    m = _FOLDED[tag].search(text, start)
    return -1 if m is None else m.start()


def excerpt(text: str) -> str:
    """The model's words as they appear in a detail: JSON-quoted (one line, escapes visible), cut at
    EXCERPT_CHARS with an ellipsis, so a detail never carries the model's line breaks or lengths into a log,
    a table or a category."""
    return json.dumps(text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…", ensure_ascii=False)


def extract_answer(text: str) -> str | None:
    """The expression inside the last <answer>...</answer>, or the whole text if it has no tags."""
    return _sides(text)[0]


def _sides(text: str) -> tuple[str | None, list[str]]:
    """(the expression, what the answer states it equals): "3 * 4 = 12" -> ("3 * 4", ["12"])."""
    found = last_tagged(text)
    answer = (text if found is None else found).strip()
    expression, *stated = answer.split("=") if "=" in answer else (answer,)
    return expression.strip() or None, [side.strip() for side in stated]


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise ZeroDivisionError("division by zero")
        return left / right
    raise ValueError(f"not allowed in an answer: {ast.dump(node)[:60]}")


def _false_statement(stated: list[str], value: Fraction) -> str | None:
    """The first side of the equation that is not an arithmetic expression equal to `value`, else None."""
    for side in stated:
        try:
            if _evaluate(ast.parse(side, mode="eval"), []) != value:
                return side
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
            return side
    return None


def check(numbers: list[int], target: int, answer_text: str) -> CountdownResult:
    """Is `answer_text` a correct Countdown answer for (numbers, target)? An answer written as an equation
    ("3 * 4 = 12") is judged by its left side, and what it states must be true: "11 + 16 = 22" for a target
    of 27 is an arithmetic error, not a solution, even though 11 + 16 is 27."""
    expr, stated = _sides(answer_text)
    if expr is None or len(expr) > MAX_EXPRESSION_CHARS:
        return CountdownResult(False, "format", "no expression found" if expr is None else "expression too long")
    if len(stated) > MAX_STATED or any(len(side) > MAX_EXPRESSION_CHARS for side in stated):
        return CountdownResult(False, "format", "not an equation: too many or too long sides after '='")
    try:  # the length cap above runs first: parsing and the walk cost at most MAX_EXPRESSION_CHARS of work
        used: list[int] = []
        value = _evaluate(ast.parse(expr, mode="eval"), used)
    # Deep nesting: CPython's parser answers SyntaxError ("too many nested parentheses"), RecursionError or
    # MemoryError by version and depth; each is the expression's fault, judged, never a checker crash.
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError) as e:
        return CountdownResult(False, "syntax", f"{type(e).__name__} in {excerpt(expr)}")
    if (false := _false_statement(stated, value)) is not None:
        return CountdownResult(
            False, "equation", f"{excerpt(expr)} = {float(value):g}, not {excerpt(false)}", float(value)
        )
    if Counter(used) != Counter(numbers):
        return CountdownResult(
            False, "numbers", f"uses {sorted(used)}, must use each of {sorted(numbers)} once", float(value)
        )
    if value != target:
        return CountdownResult(False, "value", f"{excerpt(expr)} = {float(value):g}, not {target}", float(value))
    return CountdownResult(True, "", f"{excerpt(expr)} = {target}", float(value))


# Partial credit (TinyZero-style shaping, which the ES-at-scale paper's Countdown runs rely on: the base
# model is rarely right, and ES learns only from reward differences). Exact success is always 1.0 and
# always the `proved` verdict; a shaped reward never reaches 1.0, so the two cannot be confused.
CREDIT_FORMAT = 0.1  # the answer is inside <answer> tags
CREDIT_PARSES = 0.1  # it is an arithmetic expression over integers
CREDIT_NUMBERS = 0.3  # it uses each given number exactly once
CREDIT_CLOSE = 0.3  # with the right numbers, times 1 - |value - target| / max(|target|, 1), floored at 0

# An answer's credit by part, each in [0, 1] (what a run's curves by part average): `format` the <answer>
# tags, `expression` an arithmetic expression over integers, `numbers` each given number once, `closeness`
# 1 - |value - target| / max(|target|, 1) floored at 0 (with the right numbers only), `solved` correct.
PARTS = ("format", "expression", "numbers", "closeness", "solved")
# The reward schemes (the trainer's `reward` setting): `shaped`, the partial credit above; `paper`, TinyZero's
# and the ES-at-scale paper's (Qiu et al. 2025, arXiv 2509.24372): PAPER_FORMAT for an answer in <answer>
# tags, 1.0 for a correct one, nothing between.
SCHEMES = ("shaped", "paper")
PAPER_FORMAT = 0.1


def credit_parts(answer_text: str, result: CountdownResult, target: int) -> dict[str, float]:
    """The answer's credit by part (PARTS). A correct answer has every part but `format` whole; `format` is
    its tags, whatever else."""
    tagged = 1.0 if last_tagged(answer_text) is not None else 0.0
    if result.ok:
        return {"format": tagged, "expression": 1.0, "numbers": 1.0, "closeness": 1.0, "solved": 1.0}
    # A false equation ("equation") parses but states a wrong value: no credit for numbers or closeness.
    parses = result.reason in ("numbers", "value", "equation") and result.value is not None
    right = parses and result.reason == "value"  # closeness counts only with the right numbers: "19" earns none
    close = max(0.0, 1.0 - abs(result.value - target) / max(abs(target), 1)) if right else 0.0
    return {
        "format": tagged,
        "expression": 1.0 if parses else 0.0,
        "numbers": 1.0 if right else 0.0,
        "closeness": close,
        "solved": 0.0,
    }


def scored(parts: dict[str, float], scheme: str = "shaped") -> float:
    """The reward of an answer with credit `parts` under `scheme` (SCHEMES): 1.0 solved, else the shaped
    credit (< 0.8) or the paper's format credit."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown Countdown reward {scheme!r}: use one of {', '.join(SCHEMES)}")
    if parts["solved"] >= 1.0:
        return 1.0
    if scheme == "paper":
        return PAPER_FORMAT * parts["format"]
    credit = CREDIT_FORMAT * parts["format"] + CREDIT_PARSES * parts["expression"]
    credit += CREDIT_NUMBERS * parts["numbers"] + CREDIT_CLOSE * parts["closeness"]
    return round(credit, 6)


def partial_credit(answer_text: str, result: CountdownResult, target: int) -> float:
    """The reward of an answer: 1.0 when correct, else the shaped credit above (< 0.8)."""
    return scored(credit_parts(answer_text, result, target))


def handle_request(request: dict) -> dict:
    """One checker request -> response: {"countdown": {numbers, target, answer}} -> one reply;
    {"countdown_batch": [job, ...]} -> {"results": [reply, ...]}, a reply per job, in order."""
    if request == HANDSHAKE_REQUEST:
        return {**HANDSHAKE_REPLY, "digest": CHECKER_DIGEST}
    jobs = request.get("countdown_batch")
    if isinstance(jobs, list) and 0 < len(jobs) <= MAX_BATCH:
        return {"results": [_reply(job) for job in jobs]}
    if jobs is not None:
        return {"message": f"bad countdown batch: expected a list of 1 to {MAX_BATCH} jobs"}
    return _reply(request.get("countdown"))


def _reply(job: object) -> dict:
    if not isinstance(job, dict):
        return {"message": 'unknown request: expected {"countdown": {...}}'}
    try:
        numbers = [int(n) for n in job["numbers"]]
        target = int(job["target"])
        answer = str(job["answer"])
    except (KeyError, TypeError, ValueError) as e:
        return {"message": f"bad countdown request: {e}"}
    r = check(numbers, target, answer)
    return {
        "ok": r.ok,
        "reason": r.reason,
        "detail": r.detail,
        "value": r.value,
        "score": partial_credit(answer, r, target),
    }


def run_checker(stdin=None, stdout=None) -> int:
    """Serve framed JSON requests until stdin closes (the same framing as the Lean REPL)."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    buffer: list[str] = []
    for line in stdin:
        if line.strip():
            buffer.append(line)
            continue
        if not buffer:
            continue
        try:
            request = json.loads("".join(buffer))
        except json.JSONDecodeError as e:
            # Like the REPL: unparsable input ends the process, nothing on stdout.
            print(f"uncaught exception: could not parse JSON: {e}", file=sys.stderr)
            return 1
        buffer = []
        stdout.write(json.dumps(handle_request(request), indent=1) + "\n\n")
        stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(run_checker())
