"""Judged samples picked by what a user asks (verdict, version, kind, theorem, a regex over the text) and joined
with their problem, the canonical record in `{ps:R}:theorems` the verifier judged them against: what
`python -m ops samples`, `ops theorem` and the dashboard show."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from streams.keys import Keys
from streams.schema import SchemaError
from streams.theorems import Theorem

KINDS = ("all", "train", "eval")
VERDICTS = ("proved", "rejected", "timeout")


@dataclass(frozen=True)
class Filters:
    """Which samples to show; None (or "all") lets every value through. `text`: a regular expression searched
    in the model's text, the proof it was judged by and the checker's message."""

    version: int | None = None
    verdict: str | None = None
    theorem: str | None = None
    kind: str = "all"
    text: re.Pattern[str] | None = None

    def matches(self, s: dict[str, Any]) -> bool:
        found = self.text is None or any(self.text.search(s.get(k) or "") for k in ("text", "proof", "detail"))
        return (found and (self.version is None or s["policy_version"] == self.version)
                and (self.verdict is None or s["verdict"] == self.verdict)
                and (self.theorem is None or s["theorem_id"] == self.theorem)
                and (self.kind == "all" or s["eval"] == (self.kind == "eval")))  # fmt: skip


def regex(value: str) -> re.Pattern[str]:
    """A `--text` pattern, or ValueError saying why it is not one."""
    try:
        return re.compile(value)
    except re.error as e:
        raise ValueError(f"{value!r} is not a regular expression: {e}") from e


def pick(found: Iterable[dict[str, Any]], filters: Filters, count: int) -> tuple[int, list[dict[str, Any]]]:
    """(how many samples match, the newest `count` of them, oldest first)."""
    matched = [s for s in found if filters.matches(s)]
    return len(matched), (matched[-count:] if count > 0 else [])


async def problems(redis: Redis, keys: Keys, theorem_ids: Iterable[str]) -> dict[str, dict[str, Any] | None]:
    """The run's canonical record of each theorem id (None: not registered, or unreadable), as plain data."""
    ids = sorted(set(theorem_ids))
    if not ids:
        return {}
    out: dict[str, dict[str, Any] | None] = {}
    for theorem_id, raw in zip(ids, await redis.hmget(keys.theorems, ids), strict=True):
        try:
            out[theorem_id] = None if raw is None else dataclasses.asdict(Theorem.decode(raw))
        except SchemaError:
            out[theorem_id] = None
    return out


async def with_problems(redis: Redis, keys: Keys, shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples, each with `problem`: its theorem's canonical record (None where the run has none)."""
    found = await problems(redis, keys, (s["theorem_id"] for s in shown))
    return [{**s, "problem": found.get(s["theorem_id"])} for s in shown]


def problem_lines(p: dict[str, Any] | None) -> list[str]:
    """A problem in words: Countdown's target and numbers; a Lean statement (with its informal text)."""
    if p is None:
        return ["(not in the run's {ps:R}:theorems)"]
    if p["task"] == "countdown":
        return [f"reach {p['target']} from {', '.join(map(str, p['numbers']))}, each number once"]
    lines = [f"informal: {p['informal']}"] if p.get("informal") else []
    return lines + p["statement"].split("\n")
