"""Dead letters of a run: list, show, requeue, purge (`python -m ops dlq ...`).

A dead letter keeps its entry's original fields byte for byte (`DeadLetter.original`, stored under the
`f:` prefix), so requeueing puts back exactly what the producer wrote, under a new id: the group
delivers it afresh with a delivery count of 1. Its idempotency marker was never set (a dead letter
publishes no result), so the consumer handles it as new.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis

from ops.views.inspect import entry_view, id_ms, jsonable, raw_fields, redis_now_ms
from streams.codec import ORIGINAL_PREFIX, decode
from streams.keys import Keys
from streams.schema import BY_STREAM, DeadLetter, SchemaError


class OpsError(Exception):
    """An operation that cannot be done as asked; the message says why. Exit status 1."""


# The letter is read and deleted inside the script, so two operators requeueing the same letter at
# once put it back once: the second finds nothing and gets nil. The source key is passed in KEYS (it
# shares the run's hash tag, so the script stays on one cluster slot) and checked against the letter.
_REQUEUE_LUA = """
-- KEYS[1] dead-letter stream  KEYS[2] the letter's source stream  ARGV[1] the letter's entry id
local found = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #found == 0 then return false end
local fields, original, source = found[1][2], {}, nil
for i = 1, #fields, 2 do
  local name = fields[i]
  if name == 'source' then
    source = fields[i + 1]
  elseif string.sub(name, 1, 2) == 'f:' then
    original[#original + 1] = string.sub(name, 3)
    original[#original + 1] = fields[i + 1]
  end
end
if source ~= KEYS[2] then return redis.error_reply('dead letter source is not ' .. KEYS[2]) end
if #original == 0 then return redis.error_reply('dead letter has no original fields') end
local new_id = redis.call('XADD', KEYS[2], '*', unpack(original))
redis.call('XDEL', KEYS[1], ARGV[1])
return new_id
"""


def _row(view: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """One line of `dlq list`. The dead-letter entry's own id dates the failure, on Redis's clock."""
    f = view["fields"]
    return {
        "id": view["id"],
        "age_ms": max(0, now_ms - id_ms(view["id"])),
        "source": f.get("source"),
        "group": f.get("group"),
        "original_id": f.get("original_id"),
        "deliveries": f.get("deliveries"),
        "reason": f.get("reason"),
        "consumer": f.get("consumer", ""),
        "error": view["error"],
    }


async def list_letters(redis: Redis, keys: Keys, limit: int) -> dict[str, Any]:
    """The oldest `limit` dead letters (XRANGE order), and how many there are in all."""
    now = await redis_now_ms(redis, keys)
    rows = await redis.xrange(keys.dlq, count=limit) if limit > 0 else []
    return {
        "key": keys.dlq,
        "length": await redis.xlen(keys.dlq),
        "dead_letters": [_row(entry_view("dlq", eid, f), now) for eid, f in rows],
    }


async def _read(redis: Redis, keys: Keys, entry_id: str) -> dict[bytes, bytes]:
    rows = await redis.xrange(keys.dlq, entry_id, entry_id)
    if not rows:
        raise OpsError(f"no dead letter {entry_id} in {keys.dlq}")
    return rows[0][1]


async def show_letter(redis: Redis, keys: Keys, entry_id: str) -> dict[str, Any]:
    """Every field of one dead letter, its original fields as stored, and those decoded if they can be."""
    fields = await _read(redis, keys, entry_id)
    now = await redis_now_ms(redis, keys)
    original = {k[len(ORIGINAL_PREFIX) :]: v for k, v in fields.items() if k.startswith(ORIGINAL_PREFIX)}
    letter: dict[str, Any] = {k: v for k, v in raw_fields(fields).items() if not k.startswith("f:")}
    error = None
    try:
        decoded = decode(DeadLetter, fields)
        letter = {k: v for k, v in jsonable(decoded).items() if k != "original"}
    except SchemaError as e:
        error = str(e)
    out = {
        "id": entry_id,
        "key": keys.dlq,
        "age_ms": max(0, now - id_ms(entry_id)),
        "letter": letter,
        "error": error,
        "original": raw_fields(original),
        "original_type": None,
        "original_decoded": None,
        "original_error": None,
    }
    cls = BY_STREAM.get(_short(keys, letter.get("source")))
    if cls is not None:
        out["original_type"] = cls.__name__
        try:
            out["original_decoded"] = jsonable(decode(cls, original))
        except SchemaError as e:
            out["original_error"] = str(e)
    return out


def _short(keys: Keys, source: Any) -> str | None:
    """`{ps:R}:attempts` -> `attempts` when it is a stream of this run."""
    for name, key in keys.streams().items():
        if key == source:
            return name
    return None


async def _ids(redis: Redis, keys: Keys, page: int = 1000) -> AsyncIterator[str]:
    """Every dead letter's id, oldest first, a page at a time."""
    start = "-"
    while rows := await redis.xrange(keys.dlq, min=start, count=page):
        for eid, _ in rows:
            yield eid.decode()
        start = f"({rows[-1][0].decode()}"


async def requeue(redis: Redis, keys: Keys, entry_id: str) -> dict[str, Any]:
    """Put one dead letter's original fields back on its source stream and delete it, atomically."""
    source = (await _read(redis, keys, entry_id)).get(b"source", b"").decode("utf-8", "replace")
    if _short(keys, source) in (None, "dlq"):
        raise OpsError(f"dead letter {entry_id}: source {source!r} is not a stream of run {keys.run!r}")
    new_id = await redis.register_script(_REQUEUE_LUA)(keys=[keys.dlq, source], args=[entry_id])
    if new_id is None:
        raise OpsError(f"no dead letter {entry_id} in {keys.dlq} (requeued or purged meanwhile)")
    return {"id": entry_id, "source": source, "new_id": new_id.decode()}


async def requeue_all(redis: Redis, keys: Keys) -> dict[str, Any]:
    """Requeue every dead letter; one that cannot be requeued is reported and left where it is."""
    done, failed = [], []
    async for entry_id in _ids(redis, keys):
        try:
            done.append(await requeue(redis, keys, entry_id))
        except OpsError as e:
            failed.append({"id": entry_id, "error": str(e)})
    return {"requeued": done, "failed": failed}


async def purge(redis: Redis, keys: Keys, entry_id: str) -> dict[str, Any]:
    if not await redis.xdel(keys.dlq, entry_id):
        raise OpsError(f"no dead letter {entry_id} in {keys.dlq}")
    return {"purged": [entry_id]}


async def purge_all(redis: Redis, keys: Keys) -> dict[str, Any]:
    """XDEL every dead letter seen; one added while this runs is left for the next look, not lost unseen."""
    ids = [i async for i in _ids(redis, keys)]
    for i in range(0, len(ids), 1000):
        await redis.xdel(keys.dlq, *ids[i : i + 1000])
    return {"purged": ids}
