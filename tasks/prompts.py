"""A theorem's prompt and a completion's attempt, by the theorem's task, and a chat as token ids.

What the generator (producers.service) and pass@k ask of any task; each task module owns its own prompt and
extraction (tasks.lean, tasks.countdown). A new task adds a branch to `messages` and `extract`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from streams.settings import RoleSettings
from streams.theorems import Theorem
from tasks import countdown, lean

PROMPT_FORMATS = lean.LEAN_FORMATS + countdown.COUNTDOWN_FORMATS
PromptFormat = Literal[PROMPT_FORMATS]  # the `prompt_format` setting's values


class PromptSettings(RoleSettings):
    """The `prompt_format` setting, declared once for the generator, which asks with it, and the trainer,
    which hands it to its local generators and evaluates with it."""

    prompt_format: PromptFormat = Field(
        "kimina",
        description=f"prompt format: Lean {', '.join(lean.LEAN_FORMATS)}; Countdown "
        f"{', '.join(countdown.COUNTDOWN_FORMATS)} (another task's name: the task's default)",
    )


def task_format(task: str, fmt: str) -> str:
    """The prompt format of `task` that the `prompt_format` setting `fmt` names: one of the task's own
    (Lean: tasks.lean.LEAN_FORMATS; Countdown: tasks.countdown.COUNTDOWN_FORMATS), or the task's default
    where `fmt` is another task's (the setting's default, `kimina`, is Countdown's `tinyzero`)."""
    formats = {"lean": lean.LEAN_FORMATS, "countdown": countdown.COUNTDOWN_FORMATS}
    if task not in formats:
        raise ValueError(f"no prompt format for task {task!r}")
    if fmt in formats[task]:
        return fmt
    if any(fmt in names for names in formats.values()):
        return formats[task][0]
    raise ValueError(f"unknown prompt format {fmt!r}: use one of {', '.join(PROMPT_FORMATS)}")


def messages(theorem: Theorem, fmt: str = "kimina") -> list[dict[str, str]]:
    """The chat messages that ask for an attempt at `theorem` in prompt format `fmt` (`task_format`); a
    chat that ends with the assistant's turn begun (a prefill) is continued, not answered."""
    fmt = task_format(theorem.task, fmt)
    if theorem.task == "countdown":
        return countdown.countdown_messages(theorem.numbers, theorem.target, fmt)
    return lean.messages(theorem, fmt)


SHOWN_CHARS = 600  # of each message in a run's record of its prompt: enough to read, never a whole Lean file


def applied(theorem: Theorem, fmt: str) -> dict[str, Any]:
    """The prompt a run asks with, as its run.json and report.json record it: the format applied to the task
    (`task_format`) and the chat that asks for `theorem` (the run's first problem), each message cut short."""
    chat = messages(theorem, fmt)
    return {
        "format": task_format(theorem.task, fmt),
        "theorem_id": theorem.theorem_id,
        "messages": [{"role": m["role"], "content": m["content"][:SHOWN_CHARS]} for m in chat],
    }


def extract(task: str, text: str, fmt: str = "kimina") -> str:
    """The attempt in a completion `text` for a theorem of `task`, asked in prompt format `fmt`."""
    if task == "lean":
        return lean.extract_lean(text)
    if task == "countdown":
        return countdown.extract_countdown(text, task_format(task, fmt))
    raise ValueError(f"no extraction for task {task!r}")


def tokenize(tokenizer: Any, chat: list[dict[str, str]]) -> list[int]:
    """Token ids of `chat` under the model's chat template, ready for the assistant's turn; a chat ending
    with an assistant message (a prefill) is left open for the model to continue."""
    if chat[-1]["role"] == "assistant":
        text = tokenizer.apply_chat_template(chat, continue_final_message=True, tokenize=False)
    else:
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False).input_ids)
