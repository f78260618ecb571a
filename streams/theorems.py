"""`{ps:R}:theorems`: theorem_id -> the canonical problem, written by the trainer, read by verifiers.

The verifier checks every attempt against this record, never against text that came with the attempt:
the statement a model was asked to prove is the statement its proof must prove (integrity).
Values are orjson objects with a schema version, like stream entries.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import orjson
from redis.asyncio import Redis

from streams.keys import Keys
from streams.schema import SCHEMA_VERSION, SchemaError


@dataclass(frozen=True, slots=True)
class Theorem:
    theorem_id: str
    task: str  # "lean" | "countdown"
    statement: str = ""  # lean: the formal statement, ending in ":= by"
    header: str = ""  # lean: imports, options, opens; elaborated once per REPL
    informal: str = ""  # lean: the problem in words, when the dataset has it (prompts only, never checked)
    numbers: list[int] = field(default_factory=list)  # countdown
    target: int = 0  # countdown
    # countdown: the run's reward scheme (tasks.countdown_check.SCHEMES), "" for the default (`shaped`); the
    # verifier scores by it and it joins the verdict cache key. Left out of the record while "".
    reward: str = ""

    def problem(self) -> str | None:
        """Why no verifier could check attempts at this record, or None: the record's own shape only (the Lean
        rules proper, statement assembly and header lexing, run where theorems are loaded: tasks.lean.lean_problem)."""
        if self.task == "lean":
            if not _ENDS_BY.search(self.statement):
                return f"a Lean statement must end in ':= by': {self.statement[-60:]!r}"
        elif self.task == "countdown":
            if not self.numbers or not all(type(n) is int for n in self.numbers) or type(self.target) is not int:
                return f"a Countdown problem needs integer numbers and target: {self.numbers!r}, {self.target!r}"
            if self.reward not in REWARDS:
                return f"unknown Countdown reward {self.reward!r}: use one of {', '.join(REWARDS[1:])}"
        else:
            return f"unknown task {self.task!r} (lean or countdown)"
        if self.reward and self.task != "countdown":
            return f"a reward scheme is Countdown's, not {self.task}'s"
        return None

    def encode(self) -> bytes:
        doc = asdict(self)
        if not doc["reward"]:  # the default: the record as it was before runs had a reward setting
            del doc["reward"]
        return orjson.dumps({"v": SCHEMA_VERSION, **doc})

    @classmethod
    def decode(cls, raw: bytes) -> Theorem:
        try:
            doc = orjson.loads(raw)
            if doc.pop("v", None) != SCHEMA_VERSION:
                raise SchemaError(f"theorem record of unknown schema version: {raw[:60]!r}")
            return cls(**doc)
        except (orjson.JSONDecodeError, TypeError) as e:
            raise SchemaError(f"bad theorem record {raw[:60]!r}: {e}") from e


REWARDS = ("", "shaped", "paper")  # tasks.countdown_check.SCHEMES, and "" for the default (a test keeps them equal)
_ENDS_BY = re.compile(r":=\s*by\s*$")


async def register(redis: Redis, keys: Keys, theorems: list[Theorem]) -> None:
    """Publish canonical records (idempotent: the same id always maps to the same record in a run). A record no
    verifier could check (`Theorem.problem`) is a ValueError naming it, and nothing is written: refused here,
    not dead-lettered with every attempt at it."""
    bad = [f"{t.theorem_id}: {why}" for t in theorems if (why := t.problem())]
    if bad:
        raise ValueError(f"{len(bad)} theorem(s) cannot be checked: " + "; ".join(bad[:5]))
    if theorems:
        await redis.hset(keys.theorems, mapping={t.theorem_id: t.encode() for t in theorems})


async def fetch(redis: Redis, keys: Keys, theorem_id: str) -> Theorem | None:
    raw = await redis.hget(keys.theorems, theorem_id)
    return None if raw is None else Theorem.decode(raw)
