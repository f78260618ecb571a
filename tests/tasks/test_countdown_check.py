"""The Countdown checker: exact arithmetic, each number once, no code execution."""

from __future__ import annotations

import io
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.countdown_check import (
    EXCERPT_CHARS,
    RULES,
    check,
    extract_answer,
    last_tagged,
    partial_credit,
    run_checker,
)


@pytest.mark.parametrize(
    "numbers, target, answer, ok, reason",
    [
        ([3, 4, 7], 19, "<answer>3 * 4 + 7</answer>", True, ""),
        ([3, 4, 7], 19, "<think>try 3*4 = 12</think> <answer>(3*4)+7</answer>", True, ""),
        ([7, 2], 7, "<answer>7 / 2 * 2</answer>", False, "numbers"),  # 2 used twice
        ([7, 2, 2], 7, "<answer>7 / 2 * 2</answer>", True, ""),  # exact fractions: 7/2*2 is 7
        ([3, 4, 7], 5, "<answer>(7 - 4) + 3 - 1</answer>", False, "numbers"),  # 1 is not given
        ([3, 4, 7], 20, "<answer>3 * 4 + 7</answer>", False, "value"),
        ([3, 4], 12, "<answer>3 ** 4</answer>", False, "syntax"),
        ([3, 4], 12, '<answer>__import__("os").system("id")</answer>', False, "syntax"),
        ([3, 4], 12, "<answer>3 * (4</answer>", False, "syntax"),
        ([3, 0], 1, "<answer>3 / 0</answer>", False, "syntax"),
        ([3, 4], 12, "<answer>" + "(" * 150 + "3*4" + ")" * 150 + "</answer>", False, "format"),
        ([3, 4], 12, "<answer>3 * 4 = 12</answer>", True, ""),
        # An equation's stated sides must be true: 11 + 16 is 27 but the answer says 22 (the default model
        # wrote this untagged for target 27; it was once judged proved on its left side alone).
        ([11, 16], 27, "<answer>11 + 16 = 22</answer>", False, "equation"),
        ([11, 16], 27, "11 + 16 = 22\n\nThe answer is 22.", False, "equation"),
        ([11, 16], 27, "11 + 16 = 27\n\nThe answer is 27.", False, "equation"),  # prose is not a value
        ([11, 16], 27, "<answer>11 + 16 = 27 = 3 * 9</answer>", True, ""),
        ([11, 16], 27, "<answer>11 + 16 = 27 = 27 = 27 = 27</answer>", False, "format"),  # 4 sides: too many
        ([3, 4], 12, "<answer>3 * 4 = 12 / 0</answer>", False, "equation"),
        ([3, 4], 12, "<answer></answer>", False, "format"),
        ([3, 4], 12, "<answer>3.0 * 4</answer>", False, "syntax"),  # floats are not the given numbers
    ],
)
def test_check(numbers, target, answer, ok, reason):
    result = check(numbers, target, answer)
    assert (result.ok, result.reason) == (ok, reason), result.detail


def test_last_answer_tag_wins():
    assert extract_answer("<answer>1+1</answer> no wait <answer>2*3</answer>") == "2*3"


def test_checker_program_speaks_the_repl_framing():
    requests = [
        {"countdown": {"numbers": [3, 4], "target": 7, "answer": "<answer>3+4</answer>"}},
        {"countdown": {"numbers": [3, 4], "target": 8, "answer": "<answer>3+4</answer>"}},
        {"other": 1},
    ]
    stdin = io.StringIO("".join(json.dumps(r) + "\n\n" for r in requests))
    stdout = io.StringIO()
    assert run_checker(stdin, stdout) == 0
    replies = [json.loads(chunk) for chunk in stdout.getvalue().split("\n\n") if chunk.strip()]
    assert [r.get("ok") for r in replies] == [True, False, None]
    assert "unknown request" in replies[2]["message"]


def test_unparsable_request_ends_the_checker_like_the_repl():
    stdout = io.StringIO()
    assert run_checker(io.StringIO("{not json\n\n"), stdout) == 1
    assert stdout.getvalue() == ""


def test_partial_credit_is_ordered_and_never_reaches_an_exact_answers_reward():
    def credit(text):
        return partial_credit(text, check([3, 4, 7], 19, text), 19)

    exact = credit("<answer>3 * 4 + 7</answer>")
    right_numbers_close = credit("<answer>3 * 4 + 7 - 0 * 0</answer>")  # extra numbers: a numbers error
    near = credit("<answer>3 * 7 - 4</answer>")  # 17: all numbers, close
    far = credit("<answer>3 - 4 - 7</answer>")  # -8: all numbers, far
    wrong_numbers = credit("<answer>19</answer>")
    no_tags = credit("3 * 7 - 4")
    garbage = credit("<answer>I do not know</answer>")
    false_equation = credit("<answer>3 * 4 + 7 = 18</answer>")  # the right expression, a false claim
    nothing = credit("")
    assert exact == 1.0
    assert 0.8 > near > far > wrong_numbers > garbage > nothing == 0.0
    assert near > no_tags  # the same expression without the format earns less
    assert right_numbers_close < near  # using the wrong numbers costs more than missing the target by 2
    assert wrong_numbers == right_numbers_close == 0.2  # writing the target itself earns no closeness
    assert garbage == 0.1  # the format alone
    assert false_equation == 0.2  # format and an expression: no credit for numbers or closeness


# --- untrusted text: `last_tagged` against the regex that defines it, by hand, in linear time ----------------

_FINDALL = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)  # last_tagged's definition; quadratic on unclosed tags


def test_last_tagged_agrees_with_the_regex_on_random_tag_soup():
    pieces = ["<answer>", "</answer>", "<", "/", ">", "answer", "<answer", "/answer>", "x", " ", "\n", "=", "1"]
    rng = random.Random(12)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(12)))
        found = _FINDALL.findall(text)
        assert last_tagged(text) == (found[-1] if found else None), text


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>a</answer></answer>", "a"),
        ("<answer>a <answer>b</answer>", "a <answer>b"),  # findall pairs the first opener with the first closer
        ("<answer>x</answer></answer><answer>y</answer>", "y"),
        ("<answer>1</answer><answer>2", "1"),  # an unclosed last opener is not an answer
        ("</answer><answer>", None),
        ("<answer></answer>", ""),
    ],
)
def test_last_tagged_by_hand(text, expected):
    assert last_tagged(text) == expected


MB = 1_000_000


def _adversarial(size: int) -> dict[str, tuple[str, str, str | None]]:
    """name -> (text of about `size` characters, the check's reason, extract_answer's result), by hand."""
    k = size // 17
    return {
        "unclosed tags": ("<answer>" * (size // 8), "format", None),  # no closer: the whole text, too long
        "nested tags": ("<answer>" * k + "3*4" + "</answer>" * k, "format", None),  # 8k-char-plus answer
        "unclosed after an answer": ("<answer>3*4</answer>" + "<answer>" * (size // 8), "", "3*4"),
        "parentheses": ("<answer>" + "(" * size + "</answer>", "format", None),
        "whitespace": ("<answer>" + " " * size + "3 * 4" + " " * size + "</answer>", "", "3 * 4"),
        "equals signs": ("=" * size, "format", None),  # the left side of the first "=" is empty
        "an equation chain": ("3*4" + "=12" * (size // 3), "format", "3*4"),  # too many sides, each cheap
    }


@pytest.mark.parametrize("name", list(_adversarial(100)))
def test_adversarial_answers_are_judged_in_linear_time(name):
    """1 MB and 10 MB adversarial attempts get the verdict worked out by hand, and the 10 MB one costs less
    than 20 times the 1 MB one (linear is 10; quadratic would be 100) and under 5 s."""
    seconds = {}
    for size in (MB, 10 * MB):
        text, reason, answer = _adversarial(size)[name]
        started = time.perf_counter()
        result = check([3, 4], 12, text)
        seconds[size] = time.perf_counter() - started
        assert result.reason == reason, result.detail
        if answer is not None:
            assert extract_answer(text) == answer
        elif reason == "format":
            assert "too long" in result.detail or "no expression" in result.detail
    assert seconds[10 * MB] < 5.0
    assert seconds[10 * MB] < 20 * max(seconds[MB], 0.1), seconds  # a floor: tiny times are all noise


def test_partial_credit_on_unclosed_tags_is_linear():
    text = "<answer>" * (10 * MB // 8)
    started = time.perf_counter()
    assert partial_credit(text, check([3, 4], 12, text), 12) == 0.0  # no closed tag: no format credit
    assert time.perf_counter() - started < 5.0


@pytest.mark.parametrize(
    "inner, reason",
    [
        ("(" * 98 + "3*4" + ")" * 98, ""),  # 199 characters: parsed and right
        ("(" * 200, "syntax"),  # at the cap: CPython's parser refuses the nesting, a rejection
        ("3" + "*(4" * 49 + ")" * 49, "numbers"),  # 199 characters of nested products: walked, judged
        ("(" * MB, "format"),  # past the cap: never parsed
        ("1+" * MB + "1", "format"),
    ],
)
def test_deep_nesting_is_judged_never_a_crash(inner, reason):
    result = check([3, 4], 12, f"<answer>{inner}</answer>")
    assert result.reason == reason, result.detail


def test_checker_program_answers_a_10_mb_attempt_within_seconds():
    """The sandbox's program itself, through its stdin framing: a 10 MB attempt of unclosed tags, then a
    normal one, both answered, and the process ends when stdin closes."""
    requests = [
        {"countdown": {"numbers": [3, 4], "target": 12, "answer": "<answer>" * (10 * MB // 8)}},
        {"countdown": {"numbers": [3, 4], "target": 12, "answer": "<answer>3 * 4</answer>"}},
    ]
    stdin = "".join(json.dumps(r) + "\n\n" for r in requests)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "tasks.countdown_check"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    replies = [json.loads(chunk) for chunk in done.stdout.split("\n\n") if chunk.strip()]
    assert [(r["ok"], r["reason"]) for r in replies] == [(False, "format"), (True, "")]
    assert replies[0]["score"] == 0.0
    assert elapsed < 10.0, elapsed  # interpreter start and 10 MB of JSON included; _FINDALL: over 20 min


def test_the_checker_s_answer_tags_are_case_sensitive():
    """Pinned: the generator lowers the tags it finds (tasks.countdown.extract_countdown); the checker
    reads only lowercase ones, so an uppercase pair earns no format credit and its text is the expression."""
    assert last_tagged("<ANSWER>1+2</ANSWER>") is None
    assert last_tagged("<answer>1</answer><ANSWER>2</ANSWER>") == "1"
    result = check([1, 2], 3, "<ANSWER>1+2</ANSWER>")
    assert (result.ok, result.reason) == (False, "syntax")
    assert partial_credit("<ANSWER>1+2</ANSWER>", result, 3) == 0.0


def test_the_checker_runs_from_its_two_files_alone(tmp_path):
    """What the checker image copies (ops/deploy/images/checker/Dockerfile): tasks/__init__.py and this program, and
    no site-packages. The package's init must stay import-free for this to hold."""
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "tasks").mkdir()
    for name in ("__init__.py", "countdown_check.py"):
        (tmp_path / "tasks" / name).write_bytes((root / "tasks" / name).read_bytes())
    stdin = json.dumps({"countdown": {"numbers": [3, 4], "target": 12, "answer": "<answer>3 * 4</answer>"}}) + "\n\n"
    done = subprocess.run(
        [sys.executable, "-S", "-s", "-B", "-m", "tasks.countdown_check"],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True


HOSTILE = {
    "the prompt's example, copied": "<answer>1 + 2 = 3\n\nThe answer is 3.</answer>",
    "terminal escapes": "<answer>1 + 2 = \x1b]52;c;cm0gLXJmIH4=\x07\rgone</answer>",
    "a long false side": "<answer>3 * 4 = " + "9 " * 5000 + "</answer>",
    "a call": "<answer>__import__('os').system('x')\n</answer>",
    "the right value, wrong numbers": "<answer>6 * 2</answer>",
    "a wrong value": "<answer>3 + 4</answer>",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_detail_carries_the_answer_only_as_a_short_quoted_excerpt(name):
    """A detail is read in logs, tables and `ops samples`: the model's words in it are one JSON-quoted line
    of at most EXCERPT_CHARS (its line breaks and escapes written out, never raw), so a multi-line or hostile
    answer never spills into a category or a terminal."""
    result = check([3, 4], 12, HOSTILE[name])
    assert not result.ok and result.reason in RULES
    detail = result.detail
    assert detail.isprintable() and len(detail) <= 2 * (EXCERPT_CHARS + 2) + 40, detail
    for quoted in re.findall(r'"(?:[^"\\]|\\.)*"', detail):
        assert len(json.loads(quoted)) <= EXCERPT_CHARS
    outside = re.sub(r'"(?:[^"\\]|\\.)*"', "", detail)
    assert "answer" not in outside and "os" not in outside and "gone" not in outside, detail


def test_details_as_written_by_hand():
    assert check([3, 4], 12, "<answer>1 + 2 = 3\n\nThe answer is 3.</answer>").detail == (
        '"1 + 2" = 3, not "3\\n\\nThe answer is 3."'
    )
    assert check([3, 4], 12, "<answer>3 + 4</answer>").detail == '"3 + 4" = 7, not 12'
    long_side = check([3, 4], 12, "<answer>3 * 4 = " + "9 " * 50 + "</answer>").detail
    assert long_side == '"3 * 4" = 12, not "' + ("9 " * 20)[:39] + '…"'
