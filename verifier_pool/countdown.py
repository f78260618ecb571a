"""Countdown, the offline task of the ES-at-scale paper (Qiu et al. 2025; TinyZero's format).

A problem is a list of numbers and a target; an answer is an arithmetic expression over + - * / and
parentheses that uses each given number exactly once and equals the target. The checker never calls
`eval`: it walks a Python `ast` of the expression, admitting only number literals and the four
operators, and computes with exact fractions (so 7/2*2 is 7, not 7.000000001).

`run_checker` is the program the sandbox runs (`python -m verifier_pool.countdown`): it answers JSON
requests framed like the Lean REPL's (one JSON object, then a blank line), so the Countdown task goes
through the same sandboxes, timeouts and verdicts as Lean.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200  # a longer "expression" is not an answer to a 3-6 number problem
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class CountdownResult:
    ok: bool
    reason: str  # "" | "format" | "numbers" | "value" | "syntax"
    detail: str
    value: float | None = None


def extract_answer(text: str) -> str | None:
    """The expression inside the last <answer>...</answer>, or the whole text if it has no tags."""
    found = _ANSWER_TAG.findall(text)
    answer = found[-1] if found else text
    answer = answer.strip()
    if "=" in answer:  # "3 * 4 = 12": the left side is the expression
        answer = answer.split("=", 1)[0].strip()
    return answer or None


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


def check(numbers: list[int], target: int, answer_text: str) -> CountdownResult:
    """Is `answer_text` a correct Countdown answer for (numbers, target)?"""
    expr = extract_answer(answer_text)
    if expr is None or len(expr) > MAX_EXPRESSION_CHARS:
        return CountdownResult(False, "format", "no expression found" if expr is None else "expression too long")
    try:
        used: list[int] = []
        value = _evaluate(ast.parse(expr, mode="eval"), used)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as e:
        return CountdownResult(False, "syntax", f"{type(e).__name__}: {e}"[:200])
    if Counter(used) != Counter(numbers):
        return CountdownResult(False, "numbers", f"uses {sorted(used)}, must use each of {sorted(numbers)} once",
                               float(value))  # fmt: skip
    if value != target:
        return CountdownResult(False, "value", f"{expr} = {float(value):g}, not {target}", float(value))
    return CountdownResult(True, "", f"{expr} = {target}", float(value))


# Partial credit (TinyZero-style shaping, which the ES-at-scale paper's Countdown runs rely on: the base
# model is rarely right, and ES learns only from reward differences). Exact success is always 1.0 and
# always the `proved` verdict; a shaped reward never reaches 1.0, so the two cannot be confused.
CREDIT_FORMAT = 0.1  # the answer is inside <answer> tags
CREDIT_PARSES = 0.1  # it is an arithmetic expression over integers
CREDIT_NUMBERS = 0.3  # it uses each given number exactly once
CREDIT_CLOSE = 0.3  # with the right numbers, times 1 - |value - target| / max(|target|, 1), floored at 0


def partial_credit(answer_text: str, result: CountdownResult, target: int) -> float:
    """The reward of an answer: 1.0 when correct, else the shaped credit above (< 0.8)."""
    if result.ok:
        return 1.0
    credit = CREDIT_FORMAT if _ANSWER_TAG.search(answer_text) else 0.0
    if result.reason in ("numbers", "value") and result.value is not None:
        credit += CREDIT_PARSES
        if result.reason == "value":  # closeness counts only with the right numbers: "19" alone earns none
            credit += CREDIT_NUMBERS
            credit += CREDIT_CLOSE * max(0.0, 1.0 - abs(result.value - target) / max(abs(target), 1))
    return round(credit, 6)


def handle_request(request: dict) -> dict:
    """One checker request -> response; the request shape is {"countdown": {numbers, target, answer}}."""
    job = request.get("countdown")
    if not isinstance(job, dict):
        return {"message": 'unknown request: expected {"countdown": {...}}'}
    try:
        numbers = [int(n) for n in job["numbers"]]
        target = int(job["target"])
        answer = str(job["answer"])
    except (KeyError, TypeError, ValueError) as e:
        return {"message": f"bad countdown request: {e}"}
    r = check(numbers, target, answer)
    return {"ok": r.ok, "reason": r.reason, "detail": r.detail, "value": r.value,
            "score": partial_credit(answer, r, target)}  # fmt: skip


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
