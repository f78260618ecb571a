"""The trainer's one stream read: entries of its streams in group `trainer`, acked by the caller later.

Not streams.runtime's Consumer: that one settles each entry as its handler returns, and the trainer acks an
entry only once a checkpoint holds what it read from it (trainer/run_state.py `Checkpointer`), which may be
many reads later.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from redis.asyncio import Redis

from streams.keys import TRAINER

READ_COUNT = 500  # entries a stream read takes at once

Entries = list[tuple[bytes, dict[bytes, bytes]]]


async def read_group(
    redis: Redis, consumer: str, streams: list[str], *, pending: bool, block_ms: int | None = None
) -> AsyncIterator[dict[str, Entries]]:
    """Entries of `streams` read in group `trainer`, one reply at a time ({stream: entries}, every stream
    named): new ones (one read, blocking up to `block_ms`), or with `pending` those read before and never acked
    (paged through the pending list to its end)."""
    starts: dict[str, str | bytes] = {stream: "0" if pending else ">" for stream in streams}
    while starts:
        block = None if pending else block_ms
        reply = await redis.xreadgroup(TRAINER, consumer, starts, count=READ_COUNT, block=block)
        got = {(s.decode() if isinstance(s, bytes) else s): entries for s, entries in reply or []}
        batch = {stream: got.get(stream, []) for stream in starts}
        yield batch
        for stream, entries in batch.items():
            if pending and entries:
                starts[stream] = entries[-1][0]
            else:
                del starts[stream]
