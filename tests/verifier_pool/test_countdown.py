"""The Countdown checker: exact arithmetic, each number once, no code execution."""

from __future__ import annotations

import io
import json

import pytest

from verifier_pool.countdown import check, extract_answer, run_checker


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
    from verifier_pool.countdown import partial_credit

    def credit(text):
        return partial_credit(text, check([3, 4, 7], 19, text), 19)

    exact = credit("<answer>3 * 4 + 7</answer>")
    right_numbers_close = credit("<answer>3 * 4 + 7 - 0 * 0</answer>")  # extra numbers: a numbers error
    near = credit("<answer>3 * 7 - 4</answer>")  # 17: all numbers, close
    far = credit("<answer>3 - 4 - 7</answer>")  # -8: all numbers, far
    wrong_numbers = credit("<answer>19</answer>")
    no_tags = credit("3 * 7 - 4")
    garbage = credit("<answer>I do not know</answer>")
    nothing = credit("")
    assert exact == 1.0
    assert 0.8 > near > far > wrong_numbers > garbage > nothing == 0.0
    assert near > no_tags  # the same expression without the format earns less
    assert right_numbers_close < near  # using the wrong numbers costs more than missing the target by 2
    assert wrong_numbers == right_numbers_close == 0.2  # writing the target itself earns no closeness
    assert garbage == 0.1  # the format alone
