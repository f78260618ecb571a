"""ops/redis_sizing.py on a real Redis: the figures DEPLOY.md quotes come out of the real wire, in sane ranges,
and the measurement leaves none of its keys behind."""

from __future__ import annotations

import asyncio

import pytest
import redis as redis_sync

from ops.redis_sizing import measure

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
