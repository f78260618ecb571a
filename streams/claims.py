"""A consumer's hold on the entries it is working on: refresh it while alive, hand it back when done.

A pending entry is anyone's to reclaim once it has been idle for `claim_idle_ms` (streams.runtime). A live
consumer keeps the entries in its hands from going idle by claiming them again to itself every
`claim_refresh_ms`, so the deadline is a few refresh periods, not the longest legitimate handling time, and
a dead (or stopped) consumer's work moves on in seconds (DESIGN.md, "The wire").

Both operations here check ownership first, inside one script: XCLAIM with a min-idle of 0 takes an entry
from whoever holds it, and a consumer that was stalled past the deadline (SIGSTOP, swap, a long GC pause)
must not take back on waking what another consumer reclaimed meanwhile. `XPENDING key group id id 1` names
the entry's owner; only entries still owned by the caller are claimed.

`XCLAIM ... JUSTID` leaves the delivery count alone unless RETRYCOUNT is given (redis t_stream.c
xclaimCommand: `if (retrycount >= 0) ... else if (!justid) nack->delivery_count++`, the same in 6.2 and
7.x), so a refresh costs an entry no delivery, and it resets the entry's idle time (`delivery_time`).

`Hold` is the consumer's side: the batch in hand, refreshed by the consumer's background task
(streams.runtime `Consumer.run`), and handed back (`release`) when the consumer stops, fails an entry, or comes
back from an outage. Taking over what a dead consumer left is streams/reclaim.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence

import structlog
from redis.asyncio import Redis

from streams.groups import id_order

log = structlog.get_logger("streams.claims")

# An entry as a consumer holds it: (entry id, fields, delivery count); fields are None for an entry
# handed back unread (`Hold.pending_here`).
Entry = tuple[bytes, dict[bytes, bytes] | None, int]

_REFRESH_LUA = """
-- KEYS[1] stream  ARGV[1] group  ARGV[2] consumer  ARGV[3..] entry ids the consumer believes it holds.
-- Returns the ids it still holds, whose idle time is now 0.
local group, me = ARGV[1], ARGV[2]
local mine = {}
for i = 3, #ARGV do
  local row = redis.call('XPENDING', KEYS[1], group, ARGV[i], ARGV[i], 1)[1]
  if row and row[2] == me then mine[#mine + 1] = ARGV[i] end
end
-- In chunks: unpack() of a long table would overflow Lua's C stack.
for j = 1, #mine, 500 do
  local args = {'XCLAIM', KEYS[1], group, me, 0}
  for k = j, math.min(j + 499, #mine) do args[#args + 1] = mine[k] end
  args[#args + 1] = 'JUSTID'
  redis.call(unpack(args))
end
return mine
"""

_RELEASE_LUA = """
-- KEYS[1] stream  ARGV[1] group  ARGV[2] consumer  ARGV[3] idle (ms) to backdate to; then per entry: its
-- id and the delivery count it is left with. Returns how many were still the consumer's to release.
local group, me, idle = ARGV[1], ARGV[2], ARGV[3]
local released = 0
for i = 4, #ARGV, 2 do
  local row = redis.call('XPENDING', KEYS[1], group, ARGV[i], ARGV[i], 1)[1]
  if row and row[2] == me then
    redis.call('XCLAIM', KEYS[1], group, me, 0, ARGV[i], 'IDLE', idle, 'RETRYCOUNT', ARGV[i + 1], 'JUSTID')
    released = released + 1
  end
end
return released
"""


class Claims:
    """The two scripts, registered once per client (redis-py reloads them after NOSCRIPT)."""

    def __init__(self, redis: Redis, stream: str, group: str, consumer: str) -> None:
        self.stream, self.group, self.consumer = stream, group, consumer
        self._refresh = redis.register_script(_REFRESH_LUA)
        self._release = redis.register_script(_RELEASE_LUA)

    async def refresh(self, entry_ids: Sequence[bytes]) -> list[bytes]:
        """Reset the idle time of those of `entry_ids` this consumer still owns; return those."""
        if not entry_ids:
            return []
        return await self._refresh(keys=[self.stream], args=[self.group, self.consumer, *entry_ids])

    async def release(self, entries: Sequence[tuple[bytes, int]], idle_ms: int) -> int:
        """Make each (entry id, delivery count) this consumer still owns claimable by others once idle
        passes `claim_idle_ms`: its idle time is set to `idle_ms` and its count to the one given. Entries
        another consumer took meanwhile are left alone. Returns how many were released."""
        if not entries:
            return 0
        args: list = [self.group, self.consumer, idle_ms]
        for entry_id, deliveries in entries:
            args += (entry_id, deliveries)
        return await self._release(keys=[self.stream], args=args)


class Hold:
    """The batch a consumer has in hand: kept from going idle while it works (`refresh`, every
    `claim_refresh_ms`), handed back to the group when it will not finish an entry (`release`)."""

    def __init__(self, redis: Redis, stream: str, group: str, consumer: str, idle_ms: int) -> None:
        self.redis, self.stream, self.group, self.consumer = redis, stream, group, consumer
        self.idle_ms = idle_ms  # the group's deadline (claim_idle_ms): a released entry is backdated against it
        self._claims = Claims(redis, stream, group, consumer)
        self._entries: Sequence[Entry] = ()
        self._gone: set[bytes] = set()  # of the batch in hand, those no longer ours: settled, released, taken
        # A refresh and a release of the same entry must not cross: a refresh landing after the release would
        # reset the idle time the release backdated, and the entry would wait a whole deadline for nothing.
        self._lock = asyncio.Lock()

    @contextlib.contextmanager
    def holding(self, entries: Sequence[Entry]) -> Iterator[None]:
        """`entries` are the batch in hand for the length of the block."""
        self._entries, self._gone = entries, set()  # a new set: a refresh under way keeps the one it read
        try:
            yield
        finally:
            self._entries = ()

    async def refresh(self) -> int:
        """Claim the batch in hand again. Returns how many of it another consumer reclaimed meanwhile (this
        one stalled past the deadline): those, and those we settled, are not refreshed again."""
        async with self._lock:
            batch, gone = self._entries, self._gone
            held = [entry[0] for entry in batch if entry[0] not in gone]
            if not held:
                return 0
            kept = await self._claims.refresh(held)
        if len(kept) == len(held) or self._entries is not batch:
            return 0
        # Not ours any more: settled by us (a mid-batch flush), or reclaimed by another consumer. Only the
        # second is worth a line.
        dropped = set(held) - set(kept)
        gone.update(dropped)
        taken = await self._pending(dropped)
        if taken:
            shown = [e.decode() for e in taken[:10]]
            log.warning("claims_lost", consumer=self.consumer, stream=self.stream, count=len(taken), entry_ids=shown)
        return len(taken)

    async def _pending(self, ids: set[bytes]) -> list[bytes]:
        """Which of `ids` are still pending in the group, hence (not ours) owned by another consumer."""
        out = []
        for eid in sorted(ids, key=id_order):
            if await self.redis.xpending_range(self.stream, self.group, min=eid, max=eid, count=1):
                out.append(eid)
        return out

    async def release(self, entries: Sequence[Entry], after_ms: int = 0, counted: bool = False) -> int:
        """Hand entries back without acking them: claimable by any consumer in `after_ms`. Returns how many
        were still ours to hand back.

        There is no "nack" in Redis Streams; this is its honest equivalent (`Claims.release`). An entry we
        never started (`counted=False`) gets its delivery count back, so a graceful shutdown costs it no
        delivery; a failed one keeps the delivery it used.
        """
        back = 0 if counted else 1
        async with self._lock:
            self._gone.update(entry_id for entry_id, _fields, _deliveries in entries)
            pairs = [(entry_id, deliveries - back) for entry_id, _fields, deliveries in entries]
            return await self._claims.release(pairs, idle_ms=self.idle_ms - after_ms)

    async def pending_here(self, count: int = 10_000) -> list[Entry]:
        """What the group holds under this consumer's name (after an outage: batches whose settle failed)."""
        mine = {"min": "-", "max": "+", "count": count, "consumername": self.consumer}
        rows = await self.redis.xpending_range(self.stream, self.group, **mine)
        return [(row["message_id"], None, row["times_delivered"]) for row in rows]
