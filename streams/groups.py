"""What a stream's consumer groups owe: lag, pending, oldest pending age; and safe trimming.

These are the figures backpressure and `python -m ops streams` rest on; each one is what
`XINFO GROUPS` / `XPENDING` print, so an operator with redis-cli sees the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from streams.cluster import on_slot


@dataclass(frozen=True, slots=True)
class GroupState:
    name: str
    consumers: int
    pending: int  # delivered, not acked
    lag: int  # in the stream, not yet delivered to the group
    last_delivered_id: str
    oldest_pending_id: str | None
    oldest_pending_idle_ms: int | None

    @property
    def outstanding(self) -> int:
        """Entries this group still has to finish: the measure backpressure uses."""
        return self.pending + self.lag


def _s(v: bytes | str | None) -> str | None:
    return v.decode() if isinstance(v, bytes) else v


async def group_states(redis: Redis, stream: str, lag_cap: int = 100_000) -> list[GroupState]:
    """State of every group on `stream` (empty if the stream or its groups do not exist)."""
    if not await redis.exists(stream):
        return []
    out = []
    for g in await redis.xinfo_groups(stream):
        name = _s(g["name"])
        last = _s(g["last-delivered-id"])
        lag = g.get("lag")
        if lag is None:
            # Redis 6.2 has no `lag`, and 7.x reports nil after deletions: count what lies past the
            # group's last delivered id, capped so a huge backlog costs one bounded XRANGE.
            lag = len(await redis.xrange(stream, min=f"({last}", max="+", count=lag_cap))
        oldest_id = oldest_idle = None
        # XINFO and XPENDING are two reads: a consumer may ack the last pending entry between them.
        for row in await redis.xpending_range(stream, name, min="-", max="+", count=1) if g["pending"] else []:
            oldest_id = _s(row["message_id"])
            oldest_idle = int(row["time_since_delivered"])
        out.append(GroupState(name, g["consumers"], g["pending"], int(lag), last, oldest_id, oldest_idle))
    return out


async def consumer_states(redis: Redis, stream: str, group: str) -> list[dict]:
    """XINFO CONSUMERS: name, pending, idle ms (and inactive ms on Redis >= 7.2)."""
    rows = await redis.xinfo_consumers(stream, group)
    return [{k: _s(v) if isinstance(v, bytes) else v for k, v in r.items()} for r in rows]


def id_order(entry_id: bytes | str) -> tuple[int, int]:
    """Sort key of a stream entry id ("<ms>-<seq>"): ids compare as numbers, not as text."""
    ms, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")
    return int(ms), int(seq)


def _next_id(entry_id: str) -> str:
    ms, seq = entry_id.split("-")
    return f"{ms}-{int(seq) + 1}"


async def trim_acked(redis: Redis, stream: str, keep_s: float = 0.0) -> int:
    """Delete history every group has acked: XTRIM MINID at the oldest entry any group still needs, or at
    the entries of the last `keep_s` seconds (by Redis's clock, which stamps the ids), whichever is older.

    An entry is still needed by a group if it is pending there or lies past the group's last delivered
    id. Never MAXLEN: that drops entries nobody has read. A stream with no group is left alone.
    """
    groups = await group_states(redis, stream)
    if not groups:
        return 0
    keep_from = []
    for g in groups:
        keep_from.append(g.oldest_pending_id or _next_id(g.last_delivered_id))
    if keep_s > 0:
        seconds, micros = await redis.time(**await on_slot(redis, stream))  # the clock of the stream's server
        keep_from.append(f"{max(0, seconds * 1000 + micros // 1000 - int(keep_s * 1000))}-0")
    min_id = min(keep_from, key=id_order)
    return await redis.xtrim(stream, minid=min_id, approximate=False)
