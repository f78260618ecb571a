"""`python -m ops verdicts clear --run R`: delete a run's verdict cache, `{ps:R}:verdicts`.

The cache (consumers.verifier) is one hash per run, and its fields never expire: Redis 7.0 has no per-field
TTL, and a verdict stays valid as long as its environment does (the environment is part of every field's
key, so a fixed checker or image is never served an old verdict: the old fields are merely dead weight).
Remove a run's cache once the run is finished. On a live run it costs only time: its verifiers check again
what they would have found cached. The run must be named on the command line (`--run`): the default run,
or one picked up from $PROOFSTREAM_RUN, is not enough for a deletion.

Same with redis-cli: `redis-cli HLEN '{ps:R}:verdicts'`, then `redis-cli UNLINK '{ps:R}:verdicts'`.
"""

from __future__ import annotations

import argparse
from typing import Any

import orjson
from redis.asyncio import Redis

from ops.text import on_copy
from streams.cluster import transaction
from streams.keys import Keys


async def clear(redis: Redis, keys: Keys) -> dict[str, Any]:
    """Delete the run's verdict cache; how many verdicts it held. One MULTI, so the count is what was deleted
    even while a verifier still writes. UNLINK: a cache of millions of fields is freed off Redis's main thread."""
    async with transaction(redis, keys.verdicts) as pipe:
        removed, _ = await pipe.hlen(keys.verdicts).unlink(keys.verdicts).execute()
    return {"run": keys.run, "key": keys.verdicts, "removed": removed}


def render_cleared(data: dict[str, Any]) -> str:
    line = f"removed {data['removed']} cached verdicts of run {data['run']} ({data['key']})"
    return line + ("\n" + on_copy(data["copy_of"]) if data.get("copy_of") else "")


async def cmd_clear(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    data = await clear(redis, keys)
    if getattr(args, "run_dir", None):
        data["copy_of"] = str(args.run_dir)
    print(orjson.dumps(data).decode() if getattr(args, "json", False) else render_cleared(data), flush=True)
    return 0
