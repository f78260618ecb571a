"""Taking over what a dead or stalled consumer left: entries idle past `claim_idle_ms`, one at a time.

A live consumer keeps what it holds from going idle (streams/claims.py), so an entry idle past the deadline
belongs to a consumer that is dead or stalled. `Reclaim` finds such entries with XAUTOCLAIM and hands them to
the consumer one at a time, each with its delivery count read from XPENDING (Redis's own counter, never
memory): the consumer dead-letters an entry delivered more than `max_deliveries` times (streams/letters.py
`too_often`) and handles the rest. One at a time, each settled before the next is claimed, because claiming a
batch would bump every entry's delivery count at once: if the first one kills the consumer, its neighbours
would inherit the deliveries and follow it to the dead letters.

Redis 6.2 returns claimed entries that were deleted meanwhile as bare nils, ids lost, and keeps them pending
forever (7.x drops them from the pending list itself): those of ours that no longer exist are acked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import structlog
from redis.asyncio import Redis

from streams.claims import Entry
from streams.groups import id_order

log = structlog.get_logger("streams.reclaim")

_MAX_SCANS = 200  # XAUTOCLAIM calls per pass: 2,000 pending entries examined at most


class Reclaim:
    """XAUTOCLAIM for one consumer: a cursor through the group's pending list, and when to look again."""

    def __init__(
        self, redis: Redis, stream: str, group: str, consumer: str, *, idle_ms: int, every_ms: int, page: int
    ) -> None:
        self.redis, self.stream, self.group, self.consumer = redis, stream, group, consumer
        self.idle_ms = idle_ms  # claim_idle_ms: older than this, an entry is anyone's to take
        self.every_s = every_ms / 1000  # how often to look while new entries keep coming
        self.page = page  # pending entries of ours read at once when looking for vanished ones
        self._cursor = b"0-0"
        self._next_pass = 0.0

    def due(self) -> bool:
        """Time for a pass: at most one every `every_ms`, unless `soon` asked for one."""
        now = time.monotonic()
        if now < self._next_pass:
            return False
        self._next_pass = now + self.every_s
        return True

    def soon(self) -> None:
        """Look again at the next iteration (nothing new came in, or entries were just handed back)."""
        self._next_pass = 0.0

    async def one_by_one(self, stop: asyncio.Event, limit: int) -> AsyncIterator[Entry]:
        """Up to `limit` overdue entries, claimed one at a time: the next is claimed when the consumer asks
        for it, after it settled the last one.

        XAUTOCLAIM with COUNT 1 examines at most 10 pending entries per call: the pass keeps scanning (up to
        `_MAX_SCANS` calls) until the cursor wraps, so an overdue entry deep in a long pending list is found in
        one pass."""
        taken = scans = 0
        while taken < limit and scans < _MAX_SCANS and not stop.is_set():
            scans += 1
            claimed = await self._claim(count=1)
            for entry in claimed:
                taken += 1
                yield entry
            if not claimed and self._cursor == b"0-0":
                break

    async def _claim(self, count: int) -> list[Entry]:
        """Take over entries idle past the deadline; return them with their delivery counts."""
        next_cursor, claimed, *_ = await self.redis.xautoclaim(
            self.stream, self.group, self.consumer, min_idle_time=self.idle_ms, start_id=self._cursor, count=count
        )
        self._cursor = next_cursor
        entries = [(eid, fields) for eid, fields in claimed if fields is not None]
        if len(entries) < len(claimed):
            await self._ack_vanished({eid for eid, _ in entries})
        if not entries:
            return []
        counts = await self._delivery_counts([eid for eid, _ in entries])
        log.info("reclaimed", consumer=self.consumer, stream=self.stream, count=len(entries))
        return [(eid, fields, counts.get(eid, 1)) for eid, fields in entries]

    async def _ack_vanished(self, present: set[bytes]) -> None:
        """Redis 6.2's nils: find the pending entries of ours that no longer exist in the stream; ack them."""
        rows = await self.redis.xpending_range(
            self.stream, self.group, min="-", max="+", count=self.page, consumername=self.consumer
        )
        for row in rows:
            eid = row["message_id"]
            if eid not in present and not await self.redis.xrange(self.stream, eid, eid):
                await self.redis.xack(self.stream, self.group, eid)

    async def _delivery_counts(self, ids: list[bytes]) -> dict[bytes, int]:
        first, last = min(ids, key=id_order), max(ids, key=id_order)
        rows = await self.redis.xpending_range(
            self.stream, self.group, min=first, max=last, count=len(ids) + 1000, consumername=self.consumer
        )
        wanted = set(ids)
        return {r["message_id"]: r["times_delivered"] for r in rows if r["message_id"] in wanted}
