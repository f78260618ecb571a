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
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

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
