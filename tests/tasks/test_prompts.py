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


# --- untrusted text: the answers of the regexes these replaced, in linear time ---------------------------

OLD_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9]*)[^\n`]*\n(.*?)```", re.DOTALL)  # quadratic on long info lines
OLD_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)  # quadratic on unclosed tags
OLD_CHECKER_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)  # the checker's: case kept
OLD_VERIFIER_FENCE = re.compile(r"```([^\n`]*)\n(.*?)```", re.DOTALL)  # lean_check's, before issue 16
OLD_THINK_END = re.compile(r"</think>", re.IGNORECASE)


def _old_extract_lean(text: str) -> str:
    ends = list(OLD_THINK_END.finditer(text))
    tail = text[ends[-1].end() :] if ends else text
    for region in (tail, text):
        blocks = [body for tag, body in OLD_FENCE.findall(region) if tag.lower() in ("", "lean", "lean4")]
        if blocks:
            return blocks[-1].strip("\n")
        opened = list(re.finditer(r"```[ \t]*(?:lean4|lean)[ \t]*\n", region, re.IGNORECASE))
        if opened:
            return region[opened[-1].end() :].strip("\n")
    return ""


def _old_lean_code_block(text: str) -> str:
    """verifier_pool.lean_check.lean_code_block before issue 16 (the verifier's reading)."""
    blocks = [body for tag, body in OLD_VERIFIER_FENCE.findall(text) if tag.strip().lower() in ("", "lean", "lean4")]
    if blocks:
        return blocks[-1]
    opened = list(re.finditer(r"```[ \t]*(?:lean4|lean)[ \t]*\n", text, re.IGNORECASE))
    return text[opened[-1].end() :] if opened else text


def test_extraction_agrees_with_the_old_regexes_on_random_soup():
    pieces = ["```", "`", "lean4", "lean", "LEAN", "py", " ", "\t", "\n", "x", "<answer>", "</answer>", "<ANSWER>",
              "</Answer>", "</anſwer>", "<", "/", ">", "answer", "</think>", "</THİNK>", "<think>", "1+2", "{",
              "\u00a0", "-"]  # fmt: skip
    rng = random.Random(16)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(14)))
        found = OLD_ANSWER.findall(text)
        assert last_tagged(text, ignore_case=True) == (found[-1] if found else None), text
        found = OLD_CHECKER_ANSWER.findall(text)
        assert last_tagged(text) == (found[-1] if found else None), text
        assert lean.extract_lean(text) == _old_extract_lean(text), text
        assert [(w, b) for _, w, b in lean_proof._FENCE.findall(text)] == OLD_FENCE.findall(text), text
        assert [(i, b) for i, _, b in lean_proof._FENCE.findall(text)] == OLD_VERIFIER_FENCE.findall(text), text
        block = lean_proof.code_block(text)
        assert (text if block is None else block) == _old_lean_code_block(text), text
        # The verifier's reading of what the generator extracted finds no block in it: it takes it whole.
        attempt = lean.extract_lean(text)
        assert lean_proof.code_block(attempt) in (None, attempt), text


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


# --- the two fence readings, pinned (issue 16 unifies them; each call site keeps its own) -------------------
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
