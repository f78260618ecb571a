"""Dead letters counted by where they came from and the kind of reason: what `python -m ops run` shows and
what the trainer writes into each version's metrics."""

from __future__ import annotations

from redis.asyncio import Redis

from streams.codec import decode
from streams.keys import Keys
from streams.schema import DeadLetter, SchemaError


def reason_kind(reason: str) -> str:
    """A dead letter's reason without its particulars: "poison", "infrastructure", "skipped", "schema",
    "delivered too often"."""
    if reason.startswith("delivered "):
        return "delivered too often"
    head = reason.split(":", 1)[0].strip()
    return head if head and len(head) <= 40 else reason[:40]


async def by_reason(redis: Redis, keys: Keys, newest: int) -> dict[str, int]:
    """The newest `newest` dead letters of the run counted as `<source stream>: <kind of reason>`."""
    counts: dict[str, int] = {}
    for _id, fields in await redis.xrevrange(keys.dlq, count=newest):
        try:
            letter = decode(DeadLetter, fields)
        except SchemaError:
            kind = "undecodable dead letter"
        else:
            kind = f"{letter.source.rsplit(':', 1)[-1]}: {reason_kind(letter.reason)}"
        counts[kind] = counts.get(kind, 0) + 1
    return counts
