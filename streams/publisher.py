"""Publishing with backpressure: pipelined XADD, held back while the reading group is too far behind.

Backpressure comes from the consumer group's outstanding work (lag + pending, `groups.py`), never from
MAXLEN, which would silently drop entries nobody has read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import structlog
from redis.asyncio import Redis

from streams.codec import encode_flat
from streams.groups import group_states
from streams.keys import Keys
from streams.schema import BY_STREAM, Message

log = structlog.get_logger("streams.publisher")


class Backpressure(TimeoutError):
    """The reading group stayed over the bound for longer than the caller was willing to wait."""


class Publisher:
    """Publishes messages to their streams; `max_outstanding` bounds how far `group` may fall behind."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        *,
        group: str | None = None,
        max_outstanding: int | None = None,
        poll_ms: int = 50,
    ) -> None:
        if max_outstanding is not None and (group is None or max_outstanding < 1):
            raise ValueError("backpressure needs the reading group and a bound of at least 1")
        self.redis = redis
        self.keys = keys
        self.group = group
        self.max_outstanding = max_outstanding
        self.poll_ms = poll_ms
        self.held_s = 0.0  # total time spent waiting for room, for the stage's utilization metrics
        self._stream_keys = {name: keys.stream(name) for name in BY_STREAM}

    async def publish(self, messages: Sequence[Message], *, wait_s: float | None = None) -> list[bytes]:
        """XADD every message in one pipeline round trip, after waiting for room. Returns the entry ids."""
        if not messages:
            return []
        stream_keys = self._stream_keys
        if self.max_outstanding is not None:
            for name in {m.stream for m in messages}:
                await self.wait_for_room(stream_keys[name], wait_s=wait_s)
        async with self.redis.pipeline(transaction=False) as pipe:
            # pipeline_execute_command stages the command as pipe.execute_command would (that one only
            # adds a WATCH check): redis-py's xadd() re-validates and rebuilds the argument list per call.
            # b"XADD": the packer splits a str command name into words first.
            stage = pipe.pipeline_execute_command
            for m in messages:
                stage(b"XADD", stream_keys[m.stream], b"*", *encode_flat(m))
            return await pipe.execute()

    async def outstanding(self, stream: str) -> int:
        for g in await group_states(self.redis, stream, lag_cap=self.max_outstanding or 100_000):
            if g.name == self.group:
                return g.outstanding
        # The group does not exist yet: everything in the stream is owed to it.
        return await self.redis.xlen(stream)

    async def wait_for_room(self, stream: str, *, wait_s: float | None = None) -> None:
        """Return once `group` owes fewer than `max_outstanding` entries on `stream`."""
        assert self.max_outstanding is not None
        start = time.monotonic()
        logged = False
        while (n := await self.outstanding(stream)) >= self.max_outstanding:
            waited = time.monotonic() - start
            if wait_s is not None and waited >= wait_s:
                raise Backpressure(f"{self.group} owes {n} entries on {stream} (bound {self.max_outstanding})")
            if not logged:
                log.info("backpressure", stream=stream, group=self.group, outstanding=n, bound=self.max_outstanding)
                logged = True
            await asyncio.sleep(self.poll_ms / 1000)
        self.held_s += time.monotonic() - start
