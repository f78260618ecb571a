"""What every task's loader returns (`Problems`) and raises (`DataError`); trainer.data reads the files."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from streams.theorems import Theorem


class Problems(list):
    """A `list[Theorem]` with `meta`: theorem_id -> dict of what the Theorem does not carry.

    `skipped` lists the rows a loader skipped on request. Keys a loader may set in `meta`: "split" (the
    dataset's own, when it has one), "format" ("minif2f", "lean_workbook", "stp", "formal_statement",
    "countdown"), "where" ("file:line"), "original_id" (before `duplicates="disambiguate"`), and for Countdown
    "solution" (an expression over the numbers that equals the target)."""

    def __init__(self, items: Iterable[Theorem] = (), meta: Mapping[str, dict[str, Any]] | None = None):
        super().__init__(items)
        self.meta: dict[str, dict[str, Any]] = dict(meta or {})
        self.skipped: list[str] = []  # "file:line: why", for rows a loader was told to skip


class DataError(ValueError):
    """A malformed line or file, named by file:line."""
