"""Tasks: the rules of one kind of problem, one module per task, below the roles that apply them.

A task module owns what the roles must agree on about its problems: the prompt (what the model is asked),
the extraction (what of a completion is the attempt), the loader (rows of a dataset, or a generator, into
`streams.theorems.Theorem` records) and the scoring (the checker program the sandbox runs, or the text rules
the verifier applies before Lean runs). The tasks are `lean` (with `lean_proof` and `lean_text`, the text
rules its verifier and its loader share) and `countdown` (with `countdown_check`, the sandboxed checker);
`prompts` picks a task's prompt and extraction by its name, `problems` holds what every loader returns.

Layers: `tasks` imports only `streams`, the standard library and pydantic (`prompts.PromptSettings`, the
setting a task owns), never a role; every role may import it.

This file holds only `after_reasoning`, the one rule every task's extraction starts from, and imports only
`re`: the Countdown checker runs in a sandbox with the standard library alone (`python -m
tasks.countdown_check`), and Python imports this file before it.
"""

from __future__ import annotations

import re

# Case-insensitive like Python's re.IGNORECASE (which also folds `ſ` to `s`, `K` to `k`, `İ` to `i`): `.*`
# anchored at the start, whose backtracking from the end finds the last tag in time linear in the text.
_THINK_LAST = re.compile(r"(?s:.*)</think>", re.IGNORECASE)


def after_reasoning(text: str) -> str:
    """The text after the last `</think>`; the whole text when there is none."""
    last = _THINK_LAST.match(text)
    return text[last.end() :] if last else text
