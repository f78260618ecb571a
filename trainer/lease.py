"""One trainer per run: a lease in Redis (`{ps:R}:trainer_lease`), taken at start, renewed while the run
lives, given back at the end.

Two trainers on one run would both issue members and publish versions: two histories in one stream. The
local pipeline has a file lock; a trainer given `--redis-url` has only Redis to meet the other in. The lease
is a string with a TTL (`ttl_s`) holding who has it (host, pid, a token); the holder renews it every third
of the TTL. A second trainer is refused with the holder's name, unless the holder is dead: on the same host
a pid that no longer exists (a trainer killed with SIGKILL and restarted at once takes over without
waiting), elsewhere a lease nobody renewed for `ttl_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from streams.keys import Keys
from streams.ride_out import UNAVAILABLE

log = structlog.get_logger("trainer.lease")
_LOADED = time.time()  # no lease of this process is older

# KEYS[1] the lease; ARGV[1] the value we expect there, ARGV[2] the new value ("" = delete), ARGV[3] ttl ms
_SWAP = """
local held = redis.call('GET', KEYS[1])
if held ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1
"""


class TrainerRunning(RuntimeError):
    """Another trainer holds this run."""


class TrainerLease:
    def __init__(self, redis: Redis, keys: Keys, ttl_s: float = 15.0) -> None:
        self.redis = redis
        self.key = keys.trainer_lease
        self.run = keys.run
        self.ttl_ms = int(ttl_s * 1000)
        self.holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "token": secrets.token_hex(8),
            "since": round(time.time(), 3),
        }
        self.value = orjson.dumps(self.holder)
        self.lost = asyncio.Event()  # set if another trainer took the lease from us
        self._renewer: asyncio.Task | None = None
        self._swap = redis.register_script(_SWAP)

    async def acquire(self) -> None:
        """Take the lease, or raise TrainerRunning naming the trainer that has it."""
        deadline = time.monotonic() + self.ttl_ms / 1000 + 1
        while True:
            if await self.redis.set(self.key, self.value, nx=True, px=self.ttl_ms):
                break
            raw = await self.redis.get(self.key)
            if raw is None:
                continue  # it expired between the two calls
            holder = _parse(raw)
            if self._dead_here(holder) and await self._swap(keys=[self.key], args=[raw, self.value, self.ttl_ms]):
                log.warning("trainer_lease_taken_over", run=self.run, previous=holder)
                break
            if time.monotonic() > deadline:  # renewed for longer than a TTL: its holder is alive
                raise TrainerRunning(
                    f"run {self.run!r} already has a trainer: {holder.get('host')} pid {holder.get('pid')}, since "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(holder.get('since', 0)))}. Stop it "
                    f"first, or use another --run; a trainer that died frees the run within "
                    f"{self.ttl_ms / 1000:g} s"
                )
            await asyncio.sleep(min(1.0, self.ttl_ms / 3000))
        self._renewer = asyncio.create_task(self._renew())

    def _dead_here(self, holder: dict[str, Any]) -> bool:
        """A holder on this host whose pid is gone, or is ours but from before this process started (a
        container restarted keeps its host name and, as pid 1, its pid)."""
        if holder.get("host") != self.holder["host"] or not isinstance(holder.get("pid"), int):
            return False
        if holder["pid"] == os.getpid():  # this pid: an earlier life of it (a container restarted), or us
            return float(holder.get("since", 0)) < _LOADED
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_ms / 3000)
            try:
                renewed = await self._swap(keys=[self.key], args=[self.value, self.value, self.ttl_ms])
                # gone (expired while Redis was away, or taken): take it again only if nobody else has it
                if not renewed and not await self.redis.set(self.key, self.value, nx=True, px=self.ttl_ms):
                    log.error("trainer_lease_lost", run=self.run, holder=_parse(await self.redis.get(self.key)))
                    self.lost.set()
                    return
            except UNAVAILABLE as e:  # Redis away: renew when it is back
                log.warning("trainer_lease_renew_failed", run=self.run, error=str(e))

    async def release(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        with contextlib.suppress(*UNAVAILABLE):
            await self._swap(keys=[self.key], args=[self.value, "", self.ttl_ms])

    async def __aenter__(self) -> TrainerLease:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


def _parse(raw: bytes | None) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}
