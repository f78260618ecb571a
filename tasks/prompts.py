"""A theorem's prompt and a completion's attempt, by the theorem's task, and a chat as token ids.

What the generator (producers.service) and pass@k ask of any task; each task module owns its own prompt and
extraction (tasks.lean, tasks.countdown). A new task adds a branch to `messages` and `extract`.
"""

from __future__ import annotations

from typing import Any

from streams.theorems import Theorem
from tasks import countdown, lean


def messages(theorem: Theorem, fmt: str = "kimina") -> list[dict[str, str]]:
    """The chat messages that ask for an attempt at `theorem`; `fmt` is the Lean prompt format
    (tasks.lean.LEAN_FORMATS), which Countdown's single format ignores."""
    if theorem.task == "countdown":
        return countdown.countdown_messages(theorem.numbers, theorem.target)
    if theorem.task != "lean":
        raise ValueError(f"no prompt format for task {theorem.task!r}")
    return lean.messages(theorem, fmt)


def extract(task: str, text: str) -> str:
    """The attempt in a completion `text` for a theorem of `task`."""
    if task == "lean":
        return lean.extract_lean(text)
    if task == "countdown":
        return countdown.extract_countdown(text)
    raise ValueError(f"no extraction for task {task!r}")


def tokenize(tokenizer: Any, chat: list[dict[str, str]]) -> list[int]:
    """Token ids of `chat` under the model's chat template, ready for the assistant's turn."""
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)
