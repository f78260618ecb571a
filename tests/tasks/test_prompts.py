"""Prompt formats and extraction of each task (tasks.lean, tasks.countdown) and their dispatch by task name
(tasks.prompts), on text written by hand; tests/producers/test_prompts.py runs them on the real model."""

from __future__ import annotations

import random
import re
import time

import pytest

from streams.theorems import Theorem
from tasks import countdown, lean, lean_proof, prompts
from tasks.countdown_check import last_tagged


def test_prompt_formats_carry_the_statement_as_given():
    t = Theorem(
        "t",
        "lean",
        statement="theorem t : 1 + 1 = 2 := by\n",
        header="import Mathlib\n\n",
        informal="/-- Show 1+1=2.-/\n",
    )
    kimina = prompts.messages(t, "kimina")
    assert kimina[0] == {"role": "system", "content": lean.KIMINA_SYSTEM}
    assert "# Problem:Show 1+1=2." in kimina[1]["content"]
    assert "```lean4\nimport Mathlib\n\ntheorem t : 1 + 1 = 2 := by\n```" in kimina[1]["content"]
    (deepseek,) = prompts.messages(t, "deepseek")
    assert deepseek["content"].startswith("Complete the following Lean 4 code:\n\n```lean4\nimport Mathlib")
    assert deepseek["content"].endswith(lean.DEEPSEEK_PLAN)
    with pytest.raises(ValueError, match="unknown prompt format 'gpt'"):
        prompts.messages(t, "gpt")
    assert prompts.messages(t, "equation") == kimina  # Countdown's format names Lean's default


def test_extraction_takes_the_last_block_after_the_reasoning():
    text = "<think>try\n```lean4\nbad\n```\n</think>\nplan\n```lean4\nfirst\n```\nthen\n```lean4\nlast\n```\n"
    assert lean.extract_lean(text) == "last"
    assert lean.extract_lean("<think>```lean4\nonly inside\n```</think> no code after") == "only inside"
    assert lean.extract_lean("prose\n```lean4\ntheorem t := by\n  simp") == "theorem t := by\n  simp"
    assert lean.extract_lean("no code at all") == ""
    assert (
        countdown.extract_countdown("<think>x</think> <answer> (1 + 2) * 3 </answer>") == "<answer>(1 + 2) * 3</answer>"
    )
    assert countdown.extract_countdown("<think>x</think> 1 + 2 = 3") == "1 + 2 = 3"


def test_countdown_prompt_formats():
    """`tinyzero` asks for thinking and tags with an example; `equation` asks for the equation alone and begins
    the assistant's turn with "<answer> ", which the extraction reads back in front of the completion."""
    t = Theorem("cd", "countdown", numbers=[10, 9], target=90)
    (tinyzero,) = prompts.messages(t, "tinyzero")
    assert prompts.messages(t) == prompts.messages(t, "deepseek") == [tinyzero]  # Lean's names: the default
    assert "<think> </think>" in tinyzero["content"] and "(1 + 2) / 3" in tinyzero["content"]
    user, prefill = prompts.messages(t, "equation")
    assert user["content"].startswith("Using the numbers [10, 9], create an equation that equals 90.")
    assert "example" not in user["content"] and "<think>" not in user["content"]
    assert prefill == {"role": "assistant", "content": "<answer> "}
    with pytest.raises(ValueError, match="unknown prompt format"):
        prompts.messages(t, "Equation")
    # The completion of a prefilled turn: the opened tag's first line, no format credit (no tags kept).
    assert prompts.extract("countdown", "10 * 9 = 90\n\nThe answer is: 90", "equation") == "10 * 9 = 90"
    assert prompts.extract("countdown", "\n10 * 9 </answer>\nmore", "equation") == "<answer>10 * 9</answer>"
    # The same completion asked without a prefill is judged as a whole.
    assert prompts.extract("countdown", "10 * 9 = 90\n\nThe answer is: 90") == "10 * 9 = 90\n\nThe answer is: 90"
    # An opened tag without a prefill, too; a closed pair anywhere wins over a later opened one.
    assert countdown.extract_countdown("<think>x</think> <answer> 9 * 10\nso 90") == "9 * 10"
    assert countdown.extract_countdown("<answer>1 + 2</answer> then <answer> 3") == "<answer>1 + 2</answer>"


# --- untrusted text: the readings written a second way, and by hand -------------------------------------------

# `last_tagged`'s definition (its docstring): the last match of this regex, or None; with `ignore_case`, the
# same regex with re.IGNORECASE. The regex is quadratic on unclosed tags, so it reads short texts only.
ANSWER_FINDALL = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
ANSWER_FINDALL_FOLDED = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def _fences(text: str) -> list[tuple[str, str]]:
    """Every fenced block of `text`, left to right, as (info line, body), by str.find: three backticks, an info
    line that meets a newline before any backtick, the body up to the next three backticks. Where that fails
    no block starts, and the next three backticks (from one character on) may start one."""
    blocks, at = [], text.find("```")
    while at >= 0:
        newline, tick = text.find("\n", at + 3), text.find("`", at + 3)
        close = text.find("```", newline + 1) if newline >= 0 and not 0 <= tick < newline else -1
        if close < 0:
            at = text.find("```", at + 1)
        else:
            blocks.append((text[at + 3 : newline], text[newline + 1 : close]))
            at = text.find("```", close + 3)
    return blocks


def _first_word(info: str) -> str:
    """The info line's leading run of ASCII letters and digits, after spaces and tabs."""
    word = info.lstrip(" \t")
    n = 0
    while n < len(word) and word[n].isascii() and word[n].isalnum():
        n += 1
    return word[:n]


def _after_last_opener(text: str) -> str | None:
    """The text after the last three backticks that open a Lean block never closed: spaces or tabs, `lean4` or
    `lean` in any case, spaces or tabs, a newline. None without one."""
    found, at = None, text.find("```")
    while at >= 0:
        rest = text[at + 3 :]
        word = rest.lstrip(" \t")
        for tag in ("lean4", "lean"):
            if word[: len(tag)].lower() == tag and word[: len(tag)].isascii():
                tail = word[len(tag) :]
                if tail.lstrip(" \t").startswith("\n"):
                    found = text[len(text) - len(tail.lstrip(" \t")) + 1 :]
                    break
        at = text.find("```", at + 1)
    return found


def _code_block(text: str, first_word: bool = False) -> str | None:
    """`lean_proof.code_block` from the two readings above: the last block naming Lean (its whole info line, or
    its first word), else the text after the last unclosed Lean fence, else None."""

    def names_lean(info: str) -> bool:
        return (_first_word(info) if first_word else info.strip()).lower() in ("", "lean", "lean4")

    blocks = [body for info, body in _fences(text) if names_lean(info)]
    return blocks[-1] if blocks else _after_last_opener(text)


def _extract_lean(text: str) -> str:
    """`lean.extract_lean`: after the last `</think>` (any case), else in the whole text."""
    ends = [m.end() for m in re.finditer("</think>", text, re.IGNORECASE)]
    for region in (text[ends[-1] :] if ends else text, text):
        block = _code_block(region, first_word=True)
        if block is not None:
            return block.strip("\n")
    return ""


def test_a_runs_record_of_its_prompt_is_the_format_applied_and_the_chat_cut_short():
    t = Theorem("cd", "countdown", numbers=[10, 9], target=90)
    shown = prompts.applied(t, "kimina")  # the setting's default: Countdown asks in tinyzero
    roles = [m["role"] for m in shown["messages"]]
    assert (shown["format"], shown["theorem_id"], roles) == ("tinyzero", "cd", ["user"])
    assert shown["messages"][0]["content"].startswith("Using the numbers [10, 9], create an equation that equals 90.")
    assert [m["content"] for m in prompts.applied(t, "equation")["messages"]][1] == "<answer> "
    long = Theorem("l", "lean", statement="theorem l : True := by\n" + "-- x\n" * 400, header="")
    assert max(len(m["content"]) for m in prompts.applied(long, "kimina")["messages"]) == 600


def test_extraction_agrees_with_a_second_reading_on_random_soup():
    pieces = [*"` \t\nx</>{-", "\u00a0", "```", "lean4", "lean", "LEAN", "py", "<answer>", "</answer>", "<ANSWER>"]
    pieces += ["</Answer>", "</anſwer>", "answer", "</think>", "</THİNK>", "<think>", "1+2"]
    rng = random.Random(16)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(14)))
        found = ANSWER_FINDALL_FOLDED.findall(text)
        assert last_tagged(text, ignore_case=True) == (found[-1] if found else None), text
        found = ANSWER_FINDALL.findall(text)
        assert last_tagged(text) == (found[-1] if found else None), text
        assert lean.extract_lean(text) == _extract_lean(text), text
        assert lean_proof.code_block(text) == _code_block(text), text
        assert lean_proof.code_block(text, first_word=True) == _code_block(text, first_word=True), text
        # The verifier's reading of what the generator extracted finds no block in it: it takes it whole.
        attempt = lean.extract_lean(text)
        assert lean_proof.code_block(attempt) in (None, attempt), text


# `last_tagged(text, ignore_case=True)`: findall pairs an opener with the first closer after it. By hand.
FOLDED_TAGS = [
    ("<ANSWER>1</answer>", "1"),
    ("<answer>1</ANSWER>", "1"),
    ("<anſwer>7</anſwer>", "7"),  # re.IGNORECASE folds ſ to s
    ("<answer><answer>1</answer></answer>", "<answer>1"),  # nested: the outer opener, the inner closer
    ("<answer>1</answer><answer>2", "1"),  # an unclosed last opener is no answer
    ("<answer>" * 3, None),
    ("</answer><answer>", None),
    ("<Answer>a</answer> <answer>b</ANSWER>", "b"),
]


@pytest.mark.parametrize(("text", "answer"), FOLDED_TAGS)
def test_answer_tags_in_any_case_by_hand(text, answer):
    assert last_tagged(text, ignore_case=True) == answer


MB = 1_000_000


def _adversarial(size: int) -> dict[str, tuple[str, str, str]]:
    """name -> (model text of about `size` characters, task, the attempt extracted from it, by hand)."""
    k = size // 17
    return {
        "unclosed answer tags": ("<answer>" * (size // 8), "countdown", ""),  # the line after the last one
        "an unclosed answer's long line": ("<answer> " + "1+" * (size // 2), "countdown", "1+" * 500),  # capped
        "nested answer tags": (
            "<answer>" * k + "1" + "</answer>" * k,
            "countdown",
            "<answer>" + "<answer>" * 125 + "</answer>",
        ),  # the first 1,000 characters inside
        "many reasonings": ("</think>" * (size // 8) + "<answer> 3*4 </answer>", "countdown", "<answer>3*4</answer>"),
        "fence opened, never closed, repeated": ("```lean4\nx" * (size // 10), "lean", "x"),  # each closes the last
        "info line of spaces": ("```" + " " * size, "lean", ""),  # no newline: no fence at all
        "info line of letters": ("```" + "a" * size + "`\nsimp\n```", "lean", ""),  # a backtick: no fence
        "tag of letters": ("```" + "a" * size + "\nsimp\n```", "lean", ""),  # a block tagged "aaa...a"
        "spaces before the tag": ("```" + " " * size + "lean\nsimp\n```", "lean", "simp"),
        "unclosed lean fence after spaces": ("```lean4" + " " * size + "\n  simp", "lean", "  simp"),
        "whitespace": (" \n" * (size // 2), "lean", ""),
    }


@pytest.mark.parametrize("name", list(_adversarial(100)))
def test_adversarial_model_text_is_extracted_in_linear_time(name):
    """1 MB and 10 MB adversarial texts give the attempt worked out by hand; the 10 MB one costs less than 20
    times the 1 MB one (linear is 10, quadratic 100) and under 5 s."""
    seconds = {}
    for size in (MB, 10 * MB):
        text, task, attempt = _adversarial(size)[name]
        started = time.perf_counter()
        assert prompts.extract(task, text) == attempt
        seconds[size] = time.perf_counter() - started
    assert seconds[10 * MB] < 5.0
    assert seconds[10 * MB] < 20 * max(seconds[MB], 0.1), seconds  # a floor: tiny times are all noise


# --- the generator's fence reading, pinned ------------------------------------------------------------------
# The generator's extract_lean reads a fence's language as the info line's leading run of letters and digits
# (after spaces/tabs), strips the block's newlines, looks after the reasoning first, and answers "" without
# code. Expectations worked out by hand.
GENERATOR_FENCES = [
    ("```lean4 title\nA\n```", "A"),  # first word lean4
    ("```lean 4\nA\n```", "A"),  # first word lean
    ("```lean4-x\nA\n```", "A"),  # the run of letters and digits is lean4
    ("```{lean}\nA\n```", "A"),  # no leading letters: an untagged block
    ("```\u00a0python\nA\n```", "A"),  # a no-break space is not [ \t]: untagged
    ("```python\nA\n```", ""),
    ("```LEAN4\n\nA\n\n```", "A"),  # newlines stripped
    ("```lean4 \nA", "A"),  # unclosed: the rest after the opener
    ("```lean4\t\nA\n```", "A"),
    ("```python\nx\n```\n```lean4\nA", "A"),
    ("<think>```lean4\nX\n```</think>```lean4\nY\n```", "Y"),
    ("<think>\n```lean4\nX\n```\n</think>\n```lean4\nY", "Y"),  # the unclosed one after the reasoning
    ("plain", ""),
]


@pytest.mark.parametrize(("text", "attempt"), GENERATOR_FENCES)
def test_generator_fence_reading_is_pinned(text, attempt):
    assert lean.extract_lean(text) == attempt


def test_generator_answer_tags_ignore_case_and_the_checker_s_do_not():
    assert countdown.extract_countdown("<ANSWER> 1+2 </Answer>") == "<answer>1+2</answer>"
    assert countdown.extract_countdown("<anſwer>7</anſwer>") == "<answer>7</answer>"  # re.IGNORECASE folds ſ to s
    assert last_tagged("<ANSWER>1</ANSWER><answer>2</answer>", ignore_case=True) == "2"
    assert last_tagged("<answer>1</answer><ANSWER>2</ANSWER>", ignore_case=True) == "2"
