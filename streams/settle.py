"""Publish results and ack their inputs in one Lua script: the exactly-once effect of the wire.

For each input still pending in the group the script runs `SET done NX EX ttl` -> `XADD` each result
(or, for a dead letter, `XADD dlq`); then one `XACK` of the whole batch, all in one atomic script. An
entry no longer pending was settled by another consumer (which reclaimed it while this one stalled) and
gets nothing twice, neither result nor dead letter. A duplicate
delivery (same dedup id, maybe another entry id) finds the marker and is only acked. MULTI cannot do
this: it cannot make the XADD conditional on the SET.

The SET comes first on purpose: under `maxmemory` with `noeviction`, Redis refuses a script at its first
write and lets a script that has already written run to its end, so a script either does nothing or does
all of its input's effects. One script call settles a whole batch, which is what makes the wire fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from streams.codec import encode_flat
from streams.keys import Keys
from streams.schema import DeadLetter, Message

_SETTLE_LUA = """
-- KEYS[1] source stream  KEYS[2] result stream  KEYS[3] dead-letter stream  KEYS[4..] done markers
-- ARGV[1] group  ARGV[2] marker TTL (s); then per input: kind ('r' or 'd'), entry id, number of entries
-- to add, and for each entry: its field count (names + values) followed by the fields.
local group, ttl = ARGV[1], ARGV[2]
local i, k = 3, 4
local published, duplicates, dead = 0, 0, 0
local acks = {}
while i <= #ARGV do
  local kind, id, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  i = i + 3
  -- Only an entry still pending is settled: one that another consumer settled first (it reclaimed the
  -- entry while this one stalled past the deadline) gets no second result or dead letter. A read, so the
  -- first write of the script stays the SET or XADD below (see the module docstring on OOM).
  local fresh = #redis.call('XPENDING', KEYS[1], group, id, id, 1) > 0
  local target = KEYS[3]
  if kind == 'r' then
    target = KEYS[2]
    if fresh then fresh = redis.call('SET', KEYS[k], id, 'NX', 'EX', ttl) end
    k = k + 1
  end
  if not fresh then duplicates = duplicates + 1 end
  for _ = 1, n do
    local m = tonumber(ARGV[i])
    if fresh then
      redis.call('XADD', target, '*', unpack(ARGV, i + 1, i + m))
      if kind == 'r' then published = published + 1 else dead = dead + 1 end
    end
    i = i + 1 + m
  end
  acks[#acks + 1] = id
end
-- One XACK for the batch: same effect, one command instead of one per entry.
for j = 1, #acks, 1000 do
  redis.call('XACK', KEYS[1], group, unpack(acks, j, math.min(j + 999, #acks)))
end
return {published, duplicates, dead}
"""


class Settlement:
    """Outcomes of a batch, waiting to be written in one script call."""

    __slots__ = ("keys", "source", "output", "group", "ttl_s", "_done", "_markers", "_argv")

    def __init__(self, keys: Keys, source: str, output: str, group: str, ttl_s: int) -> None:
        self.keys, self.source, self.output, self.group, self.ttl_s = keys, source, output, group, ttl_s
        self._done = keys.done("")  # marker key of dedup id X: this + X
        self._markers: list[str] = []
        self._argv: list[bytes | str | int] = []

    def __len__(self) -> int:
        return len(self._argv)

    def results(self, entry_id: bytes, dedup_id: str, results: Sequence[Message]) -> None:
        """`entry_id` is done; publish `results` unless `dedup_id` was already settled."""
        self._markers.append(self._done + dedup_id)
        argv = self._argv
        argv += (b"r", entry_id, len(results))
        for msg in results:
            fields = encode_flat(msg)
            argv.append(len(fields))
            argv += fields

    def dead(self, entry_id: bytes, letter: DeadLetter) -> None:
        """`entry_id` is given up on: record it in the dead letters and ack it."""
        fields = encode_flat(letter)
        self._argv += (b"d", entry_id, 1, len(fields), *fields)


@dataclass(frozen=True, slots=True)
class Settled:
    published: int = 0
    duplicates: int = 0
    dead: int = 0


class Settler:
    """Holds the registered script; `redis-py` re-loads it after NOSCRIPT (e.g. a restarted Redis)."""

    def __init__(self, redis: Redis) -> None:
        self._script = redis.register_script(_SETTLE_LUA)

    async def __call__(self, s: Settlement) -> Settled:
        if not s._argv:
            return Settled()
        keys = [s.source, s.output, s.keys.dlq, *s._markers]
        published, duplicates, dead = await self._script(keys=keys, args=[s.group, s.ttl_s, *s._argv])
        return Settled(published, duplicates, dead)
