"""A checker's verdict on one attempt: a value, never an exception (outcomes of untrusted work are data)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from streams.schema import VERDICTS

REASONS = ("", "lean_error", "sorry", "integrity", "wrong_answer")


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: str  # proved | rejected | timeout | error
    reason: str = ""  # rejected: lean_error | sorry | integrity | wrong_answer
    detail: str = ""  # short and human-readable: the first Lean error, the forbidden token, ...

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS or self.reason not in REASONS:
            raise ValueError(f"not a verdict: {self.verdict!r}/{self.reason!r}")

    def encode(self) -> bytes:
        return orjson.dumps([self.verdict, self.reason, self.detail])

    @classmethod
    def decode(cls, raw: bytes) -> Judgement:
        verdict, reason, detail = orjson.loads(raw)
        return cls(verdict, reason, detail)


def proved(detail: str = "") -> Judgement:
    return Judgement("proved", "", detail)


def rejected(reason: str, detail: str) -> Judgement:
    return Judgement("rejected", reason, detail)
