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

Replicas (Redis Sentinel, or any master with replicas). Replication is asynchronous: a master that dies can
take its last writes with it, and the replica promoted in its place has every write up to some point and
none after (one replication stream, applied in order; a script's effects travel as one MULTI/EXEC). So a
failover loses a settle whole, result, marker and ack together, never half of one: the input is pending
again on the new master and is judged again; nothing is lost, nothing is published twice. What the failover
costs is the work redone, and a reader that saw the lost result before the failover (the trainer) holds a
reward the new master does not have; the trainer rebuilds its state from Redis after any outage, and a
reward's second coming counts once (by attempt id), so that costs time too, not a count.

`WAIT` bounds that cost: `Settler` sends the script and `WAIT <replicas> <wait_ms>` in one pipeline (one
round trip, one connection: WAIT counts the replicas that have this connection's writes, redis-py's pipeline
holds one connection for its `execute`), and returns only when a replica has the batch or the timeout passed.
A settled batch is then one that survives a failover, and a failover loses at most the batches whose WAIT
was under way. How many replicas: `replicas` (RoleSettings.settle_replicas); None means one when the master
has a replica that is online and acked within the last `_LAG_S` seconds (INFO replication, read again every
`_REFRESH_S` and after a WAIT that fell short), else none: a lone Redis pays nothing, and a replica that
stopped answering stops costing a timeout per batch within a few seconds. 0 never waits.

On a Redis Cluster the same holds for the master of the run's slot and its replicas: the script and WAIT go
down one connection to that master (streams.cluster `slot_pipeline`), and auto mode reads that master's
INFO.

A WAIT that falls short (fewer replicas within `wait_ms`): the batch is on the master and stays settled;
`Settled.unreplicated` says so, the consumer counts it (`settle_unreplicated`) and logs, and goes on. Not
retried: waiting longer would stop the pipeline for as long as the replica is away, for a guarantee the
paragraph above gives anyway (a lost settle is redone, never doubled). Never undone or re-sent: the write
is there and is the effect. Who wants writes refused without a replica sets Redis's own
`min-replicas-to-write`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError

from streams import sentinel
from streams.cluster import ClusterClient, on_slot, slot_pipeline
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
    unreplicated: bool = False  # WAIT returned fewer replicas than asked for: on the master only (docstring)


_LAG_S = 2  # a replica acks every second (REPLCONF ACK): one silent longer than this is not waited for
_REFRESH_S = 5.0


class Replication:
    """How many replicas a write waits for, and the WAIT itself (module docstring, "Replicas")."""

    def __init__(self, redis: Redis | ClusterClient, replicas: int | None = None, wait_ms: int = 500) -> None:
        self.redis, self.replicas, self.wait_ms = redis, replicas, wait_ms
        self._wanted = 0 if replicas is None else replicas
        self._checked_at = -_REFRESH_S  # auto: read INFO at the first write
        self._lost_replica = False  # since the last `deposed`: a WAIT fell short, or the replica left INFO

    async def wanted(self, key: str) -> int:
        """Replicas a write on `key` waits for (on a cluster, the replicas of the master of `key`'s slot)."""
        if self.replicas is not None:
            return self.replicas
        now = time.monotonic()
        if now - self._checked_at >= _REFRESH_S:
            self._checked_at = now
            try:
                wanted = min(1, in_sync(await self.redis.info("replication", **await on_slot(self.redis, key))))
            except ResponseError:  # INFO renamed or refused (some hosted Redis): no replica known, none waited for
                wanted = 0
            self._lost_replica |= wanted < self._wanted
            self._wanted = wanted
        return self._wanted

    def fell_short(self) -> None:
        """A WAIT got fewer replicas than asked: in auto mode, count them again at the next write."""
        self._checked_at = -_REFRESH_S
        self._lost_replica = True

    async def deposed(self) -> bool:
        """After the master seemed to lose its replica: whether the sentinels have promoted it, so that this
        client's last writes went to a deposed master and will be thrown away (streams.sentinel `deposed`).
        False without a loss (no question asked) and on any client but a sentinel one."""
        if not self._lost_replica:
            return False
        self._lost_replica = False
        return await sentinel.deposed(self.redis)


def in_sync(info: dict) -> int:
    """Replicas of `info` (INFO replication of a master) that are online and acked within `_LAG_S` seconds.
    redis-py parses each `slaveN:ip=...,state=online,offset=...,lag=0` line into a dict."""
    replicas = (v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict))
    return sum(1 for r in replicas if r.get("state") == "online" and int(r.get("lag", _LAG_S + 1)) <= _LAG_S)


class Settler:
    """Holds the registered script; `redis-py` re-loads it after NOSCRIPT (e.g. a restarted Redis)."""

    def __init__(self, redis: Redis, replicas: int | None = None, wait_ms: int = 500) -> None:
        self._script = redis.register_script(_SETTLE_LUA)
        self._redis = redis
        self.replication = Replication(redis, replicas, wait_ms)

    async def __call__(self, s: Settlement) -> Settled:
        if not s._argv:
            return Settled()
        keys = [s.source, s.output, s.keys.dlq, *s._markers]
        args = [s.group, s.ttl_s, *s._argv]
        replicas = await self.replication.wanted(s.source)
        if not replicas:
            published, duplicates, dead = await self._script(keys=keys, args=args)
            return Settled(published, duplicates, dead)
        (published, duplicates, dead), acked = await self._settle_and_wait(keys, args, replicas)
        if acked < replicas:
            self.replication.fell_short()
        return Settled(published, duplicates, dead, unreplicated=acked < replicas)

    async def _settle_and_wait(self, keys: list, args: list, replicas: int) -> tuple[list, int]:
        """EVALSHA + WAIT in one pipeline (on a cluster, to the master of the run's slot: `slot_pipeline`);
        after NOSCRIPT (a new master, a restarted Redis), load and go again. The WAIT of a failed EVALSHA
        waited for nothing new: harmless."""
        script = self._script
        for _ in range(2):
            async with slot_pipeline(self._redis, keys[0]) as pipe:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                pipe.wait(replicas, self.replication.wait_ms)
                settled, acked = await pipe.execute(raise_on_error=False)
            if not isinstance(settled, NoScriptError):
                break
            await self._redis.script_load(script.script)
        if isinstance(settled, Exception):
            raise settled
        if isinstance(acked, Exception):
            raise acked
        return settled, acked
