"""A checker's verdict on one attempt: a value, never an exception (outcomes of untrusted work are data)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from streams.schema import VERDICTS

REASONS = ("", "lean_error", "sorry", "integrity", "statement_mismatch", "wrong_answer")


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: str  # proved | rejected | timeout | error
    reason: str = ""  # rejected: lean_error | sorry | integrity | statement_mismatch | wrong_answer
    detail: str = ""  # short and human-readable: the first Lean error, the forbidden token, ...
    score: float | None = None  # partial credit of a rejected answer (Countdown); None: the verdict's reward

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS or self.reason not in REASONS:
            raise ValueError(f"not a verdict: {self.verdict!r}/{self.reason!r}")

    def encode(self) -> bytes:
        return orjson.dumps([self.verdict, self.reason, self.detail, self.score])

    @classmethod
    def decode(cls, raw: bytes) -> Judgement:
        verdict, reason, detail, *rest = orjson.loads(raw)  # cached before `score` existed: three fields
        return cls(verdict, reason, detail, rest[0] if rest else None)


def proved(detail: str = "") -> Judgement:
    return Judgement("proved", "", detail)


def rejected(reason: str, detail: str) -> Judgement:
    return Judgement("rejected", reason, detail)
