"""Prompt formats and proof extraction: what the model is asked, and what of its answer is an attempt.

Lean formats, as the provers were trained on them (their model cards):
- `kimina`: Kimina-Prover. System "You are an expert in mathematics and Lean 4."; the user asks to think
  and solve step by step, gives the problem in words (when known) and the formal statement, header
  included, inside a ```lean4 block.
- `deepseek`: DeepSeek-Prover-V2. One user turn: "Complete the following Lean 4 code:" with the statement in
  a ```lean4 block, then the request for a proof plan before the code.

Extraction: the reasoning comes first (a `<think>...</think>` block, or plain prose), the code last. The
attempt is the last ```lean4 block after the reasoning, exactly as the model wrote it: the statement it
contains is kept as given, and the verifier checks it against the canonical one (integrity), never this
module. A generation cut off inside its final block keeps what it has (the verifier judges it).

Countdown (TinyZero's format, used by the ES-at-scale paper): think in <think> tags, answer in <answer>
tags; the attempt is the last <answer> block (without one, the text after the reasoning, which the
verifier judges like any other answer, with less partial credit).
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from streams.theorems import Theorem

LEAN_FORMATS = ("kimina", "deepseek")
KIMINA_SYSTEM = "You are an expert in mathematics and Lean 4."
DEEPSEEK_PLAN = (
    "Before producing the Lean 4 code to formally prove the given theorem, provide a detailed proof plan "
    "outlining the main proof steps and strategies.\nThe plan should highlight key ideas, intermediate lemmas, "
    "and proof structures that will guide the construction of the final formal proof."
)

# Model text is untrusted and may be megabytes long: every pattern below runs in time linear in it.
# A fence: ``` and its info line (spaces, the language tag, anything but a backtick), a body, ```. The
# possessive `*+` keep the old greedy reading (the tag is the whole alphanumeric run) without backtracking:
# `([A-Za-z0-9]*)[^\n`]*` made an info line of k letters or spaces cost k^2 steps before failing.
_FENCE = re.compile(r"```[ \t]*+([A-Za-z0-9]*+)[^\n`]*+\n(.*?)```", re.DOTALL)
_OPEN_LEAN = re.compile(r"```[ \t]*+(?:lean4|lean)[ \t]*\n", re.IGNORECASE)
# Tags, case-insensitive like Python's re.IGNORECASE (which also folds `ſ` to `s`, `K` to `k`, `İ` to `i`):
# a search for each tag, and `.*` anchored at the start, whose backtracking from the end finds the last one.
_THINK_LAST = re.compile(r"(?s:.*)</think>", re.IGNORECASE)
_ANSWER_OPEN = re.compile("<answer>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile("</answer>", re.IGNORECASE)
_ANSWER_OPEN_LAST = re.compile(r"(?s:.*)<answer>", re.IGNORECASE)
_ANSWER_CLOSE_LAST = re.compile(r"(?s:.*)</answer>", re.IGNORECASE)
_INFORMAL_COMMENT = re.compile(r"^\s*/--(.*?)-/\s*$", re.DOTALL)


def messages(theorem: Theorem, fmt: str = "kimina") -> list[dict[str, str]]:
    """The chat messages that ask for an attempt at `theorem` in prompt format `fmt`."""
    if theorem.task == "countdown":
        return countdown_messages(theorem.numbers, theorem.target)
    if theorem.task != "lean":
        raise ValueError(f"no prompt format for task {theorem.task!r}")
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


def countdown_messages(numbers: list[int], target: int) -> list[dict[str, str]]:
    prompt = (
        f"Using the numbers {list(numbers)}, create an equation that equals {target}. You can use basic "
        "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in "
        "<think> </think> tags. And return the final answer in <answer> </answer> tags, for example "
        "<answer> (1 + 2) / 3 </answer>."
    )
    return [{"role": "user", "content": prompt}]


def _informal_text(informal: str) -> str:
    """miniF2F keeps the problem as a `/-- ... -/` doc comment; the prompt wants the words."""
    m = _INFORMAL_COMMENT.match(informal or "")
    return (m.group(1) if m else informal or "").strip()


def tokenize(tokenizer: Any, chat: list[dict[str, str]]) -> list[int]:
    """Token ids of `chat` under the model's chat template, ready for the assistant's turn."""
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def after_reasoning(text: str) -> str:
    """The text after the last `</think>`; the whole text when there is none."""
    last = _THINK_LAST.match(text)
    return text[last.end() :] if last else text


def _last_start(last_tag: re.Pattern[str], tag: str, text: str, end: int) -> int:
    """Where the last `tag` wholly before `end` starts (`last_tag` is `(?s:.*)` + tag); -1 if none."""
    m = last_tag.match(text, 0, end)
    return -1 if m is None else m.end() - len(tag)


def _first_start(tag: re.Pattern[str], text: str, start: int) -> int:
    m = tag.search(text, start)
    return -1 if m is None else m.start()


def last_answer(text: str) -> str | None:
    """What `re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL | re.IGNORECASE)[-1]` returns (None for no
    match), in linear time: that regex is quadratic on unclosed tags (each opener scans to the end).

    findall pairs an opener with the first closer after it and resumes after that closer, and the two tags
    never overlap, so the last match closes at the first closer after the last opener that has a closer
    after it, and opens at the first opener after the last closer before that opener. (Also in
    verifier_pool.countdown.last_tagged, case-sensitive; issue 16.)"""
    last_close = _last_start(_ANSWER_CLOSE_LAST, "</answer>", text, len(text))
    last_open = _last_start(_ANSWER_OPEN_LAST, "<answer>", text, last_close) if last_close >= 0 else -1
    if last_open < 0:
        return None
    close = _first_start(_ANSWER_CLOSE, text, last_open + len("<answer>"))
    before = _last_start(_ANSWER_CLOSE_LAST, "</answer>", text, last_open)
    start = _first_start(_ANSWER_OPEN, text, before + len("</answer>") if before >= 0 else 0)
    return text[start + len("<answer>") : close]


def extract_lean(text: str) -> str:
    """The attempt in a Lean completion: the last ```lean4 (or ```lean, or untagged) block after the
    reasoning; else the code after an unclosed ```lean4 fence (cut off by the token limit); else ""
    (the model wrote no code: the verifier rejects the empty attempt)."""
    tail = after_reasoning(text)
    for region in (tail, text):  # a model that put its code inside the reasoning still gets judged
        blocks = [body for tag, body in _FENCE.findall(region) if tag.lower() in ("", "lean", "lean4")]
        if blocks:
            return blocks[-1].strip("\n")
        opened = deque(_OPEN_LEAN.finditer(region), maxlen=1)  # the last one, without a list of them all
        if opened:
            return region[opened[0].end() :].strip("\n")
    return ""


MAX_COUNTDOWN_CHARS = 1000


def extract_countdown(text: str) -> str:
    """The last <answer>...</answer> (after the reasoning, else anywhere), tags kept, the expression inside
    stripped; without tags, the text after the reasoning, capped, for the verifier to judge (a missing
    format earns less)."""
    found = last_answer(after_reasoning(text))
    found = last_answer(text) if found is None else found
    if found is not None:  # the tags stay: the verifier's partial credit counts the format
        return f"<answer>{found.strip()[:MAX_COUNTDOWN_CHARS]}</answer>"
    return after_reasoning(text).strip()[:MAX_COUNTDOWN_CHARS]


def extract(task: str, text: str) -> str:
    if task == "lean":
        return extract_lean(text)
    if task == "countdown":
        return extract_countdown(text)
    raise ValueError(f"no extraction for task {task!r}")
