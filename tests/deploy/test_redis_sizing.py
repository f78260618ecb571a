"""ops/deploy/redis_sizing.py on a real Redis: the figures DEPLOY.md quotes come out of the real wire, in sane ranges,
and the measurement leaves none of its keys behind."""

from __future__ import annotations

import asyncio

import pytest
import redis as redis_sync

from ops.deploy.redis_sizing import kill_clients, measure
from streams.connect import connect

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("profile", ["countdown", "lean", "grpo"])
def test_bytes_per_attempt(redis_url: str, profile: str) -> None:
    figures = asyncio.run(measure(redis_url, profile, 1000))
    b = figures["bytes_per_attempt"]
    low, high = {"countdown": (20, 1000), "lean": (1500, 3000), "grpo": (10_000, 16_000)}[profile]
    assert low <= b["attempt_entry"] <= high, b
    assert 50 <= b["reward_entry"] <= 600 and 50 <= b["done_marker"] <= 300, b
    assert b["in_flight"] > b["after_trim"] > 0, b  # trimming the acked attempts frees their entries
    client = redis_sync.Redis.from_url(redis_url)
    assert list(client.scan_iter(match="{ps:sizing-*")) == []
    client.close()


def test_the_writers_connections_are_gone_before_memory_is_read(redis_url: str) -> None:
    """A closed connection's ~1 MB query buffer lingers until the server reads its EOF (a CI run measured 3,113
    bytes an attempt for 1,874): the writer's connections are killed by name, and only they are."""

    async def go() -> tuple[list, list]:
        reader, writer, other = connect(redis_url), connect(redis_url, client_name="w"), connect(redis_url)
        await asyncio.gather(writer.ping(), other.client_setname("other"))
        before = sorted(c["name"] for c in await reader.client_list())
        await kill_clients(reader, "w")
        after = sorted(c["name"] for c in await reader.client_list())
        for client in (reader, writer, other):
            await client.aclose()
        return before, after

    assert asyncio.run(go()) == (["", "other", "w"], ["", "other"])
