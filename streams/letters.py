"""Dead letters: the one way a consumer (or the sweep) writes one, and the counts by where they came from and
the kind of reason (what `python -m ops run` shows and what the trainer writes into each version's metrics)."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from streams.codec import decode
from streams.keys import Keys
from streams.schema import DeadLetter, SchemaError


def letter(
    stream: str, group: str, consumer: str, entry_id: bytes, fields: dict[bytes, bytes], deliveries: int, reason: str
) -> DeadLetter:
    """The dead letter of entry `entry_id` of `stream`, its fields kept byte for byte (so it can be requeued as
    it was), written by `consumer` of `group` now."""
    return DeadLetter(
        source=stream,
        group=group,
        original_id=entry_id.decode(),
        deliveries=deliveries,
        reason=reason,
        consumer=consumer,
        failed_ms=int(time.time() * 1000),
        original=dict(fields),
    )


def too_often(deliveries: int, max_deliveries: int) -> str:
    """The reason of an entry dead-lettered for its delivery count (Redis's own, from XPENDING)."""
    return f"delivered {deliveries} times (max {max_deliveries})"


def reason_kind(reason: str) -> str:
    """A dead letter's reason without its particulars: "poison", "infrastructure", "skipped", "schema",
    "delivered too often" (`too_often`)."""
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
