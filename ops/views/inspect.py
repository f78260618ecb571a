"""What `python -m ops streams` and `tail` read: stream lengths, group figures, decoded entries.

Every function returns plain JSON-ready data (str, int, None, lists, dicts), so `--json` and the text view
print the same figures. Reads only: XLEN, XINFO, XPENDING, XRANGE, XREVRANGE and XREAD, never a consumer
group, so inspecting a run cannot steal, claim or ack anything.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import orjson
from redis.asyncio import Redis

from streams import letters, role_stats
from streams.cluster import on_slot
from streams.codec import VERSION_FIELD, decode
from streams.groups import consumer_states, group_states
from streams.keys import Keys
from streams.schema import BY_STREAM, DeadLetter, SchemaError
from trainer.orders import Order


def safe(raw: bytes) -> str | dict[str, Any]:
    """Bytes as text when they are UTF-8, else `{"base64": ..., "bytes": n}`.

    Entries may hold packed arrays or the very bytes that got them dead-lettered; this keeps them
    printable and JSON-safe without ever altering what an operator sees.
    """
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode(), "bytes": len(raw)}


def jsonable(value: Any) -> Any:
    """A decoded message or field value as JSON-ready data (bytes through `safe`)."""
    if isinstance(value, bytes):
        return safe(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {_key(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def raw_fields(fields: dict[bytes, bytes]) -> dict[str, Any]:
    return {_key(k): safe(v) for k, v in fields.items()}


def _key(k: bytes | str) -> str:
    return k.decode("utf-8", "backslashreplace") if isinstance(k, bytes) else k


def id_ms(entry_id: str | bytes) -> int:
    """Milliseconds part of a stream id: when Redis added the entry, on Redis's clock."""
    return int(_key(entry_id).split("-")[0])


async def redis_now_ms(redis: Redis, keys: Keys | None = None) -> int:
    """Redis's clock, the one entry ids are stamped with, so ages do not depend on this machine's (on a
    cluster, the clock of the master holding the run's slot)."""
    seconds, micros = await redis.time(**(await on_slot(redis, keys.prefix) if keys else {}))
    return seconds * 1000 + micros // 1000


# -- streams ------------------------------------------------------------------------------------------


async def stream_report(redis: Redis, keys: Keys) -> dict[str, Any]:
    """Length of every stream of the run; per group lag, pending, oldest pending; per consumer pending, idle."""
    now = await redis_now_ms(redis, keys)
    info = await redis.info("server", **await on_slot(redis, keys.prefix))
    streams = {}
    for name, key in keys.streams().items():
        groups = {}
        for g in await group_states(redis, key):
            oldest = g.oldest_pending_id
            groups[g.name] = {
                "lag": g.lag,
                "pending": g.pending,
                "last_delivered_id": g.last_delivered_id,
                "oldest_pending_id": oldest,
                "oldest_pending_age_ms": max(0, now - id_ms(oldest)) if oldest else None,
                "oldest_pending_idle_ms": g.oldest_pending_idle_ms,
                "consumers": [_consumer(c) for c in await consumer_states(redis, key, g.name)],
            }
        streams[name] = {"key": key, "length": await redis.xlen(key), "groups": groups}
    return {"run": keys.run, "redis_version": _key(info["redis_version"]), "now_ms": now, "streams": streams}


def without_idle(report: dict[str, Any]) -> dict[str, Any]:
    """A report of a finished run's copy with its idle times blanked: Redis counts a consumer's idle time, and
    a pending entry's, from when it loaded the data (the copy's start), so they say nothing about the run."""
    for stream in report.get("streams", {}).values():
        for group in stream["groups"].values():
            group["oldest_pending_idle_ms"] = None
            for c in group["consumers"]:
                c["idle_ms"] = c["inactive_ms"] = None
    for group in report.get("groups", {}).values():
        group["oldest_pending_idle_ms"] = None
    return {**report, "idle_kept": False}


def _consumer(row: dict) -> dict[str, Any]:
    # `inactive` (ms since the last successful read or claim) exists from Redis 7.2 on.
    return {"name": row["name"], "pending": row["pending"], "idle_ms": row["idle"], "inactive_ms": row.get("inactive")}


# -- a run's health ------------------------------------------------------------------------------------

# The generators' figures `ops run` shows (streams/role_stats.py GeneratorStats), each 0 where a report lacks it.
GENERATOR_FIGURES = ("orders", "attempts", "stale_skipped", "settled_skipped", "policy_errors")
DLQ_SCAN = 10_000  # dead letters read to count by reason (the newest ones; the total is XLEN)


async def run_report(redis: Redis, keys: Keys, streams: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run's health: the trainer (version, in flight and their age, counts), its lease, the generators'
    figures, dead letters by reason, the oldest pending entry of every group, the last version's metrics.
    `streams`: a `stream_report` the caller has already read (ops.views.dashboard needs both)."""
    now = await redis_now_ms(redis, keys)
    raw_state = await redis.hget(keys.trainer_state, "state")
    state = orjson.loads(raw_state) if raw_state else None
    trainer: dict[str, Any] | None = None
    if state is not None:
        work = [*state.get("members", [])]
        running = [m for m in work if not Order.from_dict(m).complete]
        ages = [max(0, now - int(m["issued_at"] * 1000)) for m in running if m.get("issued_at")]
        trainer = {
            "algo": state.get("algo"),
            "version": state.get("version"),
            "finished": state.get("finished"),
            "in_flight": len(running),
            "complete_waiting": len(work) - len(running),
            "oldest_in_flight_ms": max(ages, default=None),
            "evals_in_flight": len(state.get("evals", [])),
            "counts": state.get("counts", {}),
        }
    lease = await redis.get(keys.trainer_lease)
    alert = await redis.get(keys.trainer_alert)
    generators = await role_stats.generators(redis, keys)
    by_reason = await letters.by_reason(redis, keys, DLQ_SCAN)
    streams = streams or await stream_report(redis, keys)
    pending = {
        f"{name}/{group}": {
            k: g[k] for k in ("pending", "lag", "oldest_pending_id", "oldest_pending_age_ms", "oldest_pending_idle_ms")
        }
        for name, st in streams["streams"].items()
        for group, g in st["groups"].items()
    }
    last = await redis.xrevrange(keys.metrics, count=1)
    metrics = orjson.loads(last[0][1][b"json"]) if last else None
    return {
        "run": keys.run,
        "now_ms": now,
        "trainer": trainer,
        "lease": orjson.loads(lease) if lease else None,
        "alert": orjson.loads(alert) if alert else None,  # the run is stalled, and why (trainer/progress.py)
        "generators": {name: {k: g.get(k, 0) for k in GENERATOR_FIGURES} for name, g in generators.items()},
        "dead_letters": {
            "total": await redis.xlen(keys.dlq),
            "by_reason": by_reason,
            "counted_of_newest": sum(by_reason.values()),
        },
        "groups": pending,
        "last_metrics": metrics,
    }


# -- entries ------------------------------------------------------------------------------------------


def entry_view(stream: str, entry_id: bytes, fields: dict[bytes, bytes]) -> dict[str, Any]:
    """One entry decoded with its stream's schema: the fields it carries, typed; raw if it does not decode.

    `type` is the message class, or None for a stream without a schema (metrics) or an entry that does
    not decode, in which case `error` says why and `fields` are the raw bytes made safe.
    """
    view: dict[str, Any] = {"id": _key(entry_id), "type": None, "fields": raw_fields(fields), "error": None}
    cls = BY_STREAM.get(stream)
    if cls is None:
        return view
    try:
        message = decode(cls, fields)
    except SchemaError as e:
        view["error"] = str(e)
        return view
    present = {_key(k) for k in fields}
    typed = {"v": _key(fields[VERSION_FIELD])}
    typed |= {f.name: jsonable(getattr(message, f.name)) for f in dataclasses.fields(message) if f.name in present}
    if cls is DeadLetter:
        typed["original"] = raw_fields(message.original)
    view.update(type=cls.__name__, fields=typed)
    return view


async def tail(redis: Redis, keys: Keys, stream: str, count: int) -> list[dict[str, Any]]:
    """The last `count` entries of `stream`, oldest first."""
    rows = await redis.xrevrange(keys.stream(stream), count=count) if count > 0 else []
    return [entry_view(stream, eid, f) for eid, f in reversed(rows)]


async def follow(
    redis: Redis, keys: Keys, stream: str, after: str, stop: asyncio.Event, *, block_ms: int = 500
) -> AsyncIterator[dict[str, Any]]:
    """Entries added to `stream` after id `after`, as they come, until `stop` is set: plain XREAD BLOCK,
    no group, no ack.

    Starting from the last id already shown, not `$`, so an entry added between the tail and the first
    XREAD is not missed. `stop` is checked between reads (so it ends within `block_ms`) rather than
    cancelling a read: on Python 3.11, a cancellation that lands on redis-py's zero-second health-check
    timeout is swallowed, and the loop would go on reading.
    """
    key = keys.stream(stream)
    last = after
    while not stop.is_set():
        reply = await redis.xread({key: last}, count=100, block=block_ms)
        for _key_name, entries in reply or []:
            for eid, fields in entries:
                last = _key(eid)
                yield entry_view(stream, eid, fields)
