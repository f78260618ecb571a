"""The Countdown task: the prompt, what of a completion is the answer, the problems, an answer's reward.

The checker that judges an answer runs inside a sandbox and lives in tasks/countdown_check.py (stdlib only,
its own file for that reason); the reading of `<answer>` tags (`last_tagged`: case-insensitive here, where
the answer is found, exact there, where it is judged), `check` and the partial credit are imported from
there, so each exists once.

Prompts (`COUNTDOWN_FORMATS`, the `prompt_format` setting):
- `tinyzero` (the default): TinyZero's question, which the ES-at-scale paper's Countdown runs use: think in
  <think> tags, answer in <answer> tags, "for example <answer> (1 + 2) / 3 </answer>". The default model
  copies the example instead of answering (docs/EXPERIMENTS.md).
- `equation`: the same question without the thinking and the example, asking for the equation alone, and
  the assistant's turn begun with "<answer> " (`PREFILLS`): the default model then writes an equation in
  the problem's own numbers. The prefill is part of the prompt; the extraction reads it back in front of
  the completion.

The attempt is the last <answer>...</answer> block; else the first line after an <answer> the model opened
and never closed (what the `equation` prompt's completions mostly are: "10 * 9 = 90\n\nThe answer is 90"),
judged without the format credit; else the text after the reasoning, which the verifier judges like any
other answer, with less partial credit.

Problems: `countdown_problems` draws seeded solvable problems (with curricula); `parse_row` reads a dataset
row (`numbers`, `target`, optional `id` and `solution`).
"""

from __future__ import annotations

import random
import re
from typing import Any

from streams.theorems import Theorem
from tasks import after_reasoning
from tasks.countdown_check import (
    CREDIT_CLOSE,
    CREDIT_FORMAT,
    CREDIT_NUMBERS,
    CREDIT_PARSES,
    PARTS,
    RULES,
    CountdownResult,
    check,
    credit_parts,
    last_tagged,
    scored,
)
from tasks.problems import DataError, Problems

MAX_COUNTDOWN_CHARS = 1000
COUNTDOWN_FORMATS = ("tinyzero", "equation")
PREFILLS = {"tinyzero": "", "equation": "<answer> "}  # how the assistant's turn begins
# The last opening tag, like tasks._THINK_LAST: `.*` anchored at the start, linear in the text.
_ANSWER_OPEN_LAST = re.compile(r"(?s:.*)<answer>", re.IGNORECASE)
CURRICULA = (None, "easy", "ramp")
_OPS = ("+", "-", "*", "/")

# --- prompt, answer, reward -----------------------------------------------------------------------------


def countdown_messages(numbers: list[int], target: int, fmt: str = "tinyzero") -> list[dict[str, str]]:
    """The chat that asks for an answer in prompt format `fmt`; with a prefill, the assistant's turn begun."""
    task = (
        f"Using the numbers {list(numbers)}, create an equation that equals {target}. You can use basic "
        "arithmetic operations (+, -, *, /) and each number can only be used once."
    )
    if fmt == "tinyzero":
        ask = (
            " Show your work in <think> </think> tags. And return the final answer in <answer> </answer> tags, "
            "for example <answer> (1 + 2) / 3 </answer>."
        )
    elif fmt == "equation":
        ask = " Write only the equation, in <answer> </answer> tags."
    else:
        raise ValueError(f"unknown Countdown prompt format {fmt!r}: use one of {', '.join(COUNTDOWN_FORMATS)}")
    chat = [{"role": "user", "content": task + ask}]
    return chat + [{"role": "assistant", "content": PREFILLS[fmt]}] if PREFILLS[fmt] else chat


def extract_countdown(text: str, fmt: str = "tinyzero") -> str:
    """The last <answer>...</answer> (after the reasoning, else anywhere), tags kept, the expression inside
    stripped; without one, the first line after an <answer> opened and never closed (no tags: no format
    credit); else the text after the reasoning, capped, for the verifier to judge (a missing format earns
    less). `text` is the completion; the prompt format's prefill is read in front of it."""
    text = PREFILLS[fmt] + text
    found = last_tagged(after_reasoning(text), ignore_case=True)
    found = last_tagged(text, ignore_case=True) if found is None else found
    if found is not None:  # the tags stay: the verifier's partial credit counts the format
        return f"<answer>{found.strip()[:MAX_COUNTDOWN_CHARS]}</answer>"
    tail = after_reasoning(text)
    if (opened := _ANSWER_OPEN_LAST.match(tail)) is not None:
        return tail[opened.end() :].strip().split("\n", 1)[0].strip()[:MAX_COUNTDOWN_CHARS]
    return tail.strip()[:MAX_COUNTDOWN_CHARS]


def reward(numbers: list[int], target: int, answer: str, scheme: str = "shaped") -> float:
    """The reward the verifier gives `answer` under reward `scheme` (1.0 when correct, else the checker's
    partial credit, or the paper's format credit), computed in this process: for measurements that score
    answers without a sandbox (evals.members). Parsing only, nothing of the answer is run."""
    return scored(credit_parts(answer, check(list(numbers), target, answer), target), scheme)


def verdict_parts(answer: str, verdict: str, detail: str, score: float | None) -> dict[str, float]:
    """The credit by part (tasks.countdown_check.PARTS) of an answer the sandboxed checker judged, from its
    verdict: what the verifier sends with each reward. The checker's verdict carries its shaped score and its
    rule (the detail's first word, verifier_pool.checkers), and the parts follow from them and the answer's
    tags, which the checker reads with the same `last_tagged`: an answer refused by `value` has the expression
    and the numbers, and its closeness is what its score holds above those and its tags. Any other verdict
    (a timeout, a checker that crashed on it) has no part."""
    if verdict == "proved":
        return credit_parts(answer, _SOLVED, 0)
    rule = detail.split(":", 1)[0]
    if verdict != "rejected" or score is None or rule not in RULES:
        return dict.fromkeys(PARTS, 0.0)
    tagged = 1.0 if last_tagged(answer) is not None else 0.0
    parts = {"format": tagged, "expression": 0.0, "numbers": 0.0, "closeness": 0.0, "solved": 0.0}
    if rule in ("numbers", "value", "equation"):
        parts["expression"] = 1.0
    if rule == "value":
        above = score - CREDIT_FORMAT * tagged - CREDIT_PARSES - CREDIT_NUMBERS
        parts["numbers"], parts["closeness"] = 1.0, round(min(1.0, max(0.0, above / CREDIT_CLOSE)), 6)
    return parts


_SOLVED = CountdownResult(True, "", "")


# --- problems -------------------------------------------------------------------------------------------


def parse_row(row: dict, where: str) -> tuple[Theorem, dict[str, Any]]:
    """A dataset row (`numbers`, `target`, optional `id`/`name`, `split`, `solution`) -> (Theorem, meta)."""
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
    passes `tasks.countdown_check.check`.

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
