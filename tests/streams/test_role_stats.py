"""streams/role_stats.py against a real Redis: what a role publishes is what every reader gets, by name."""

from __future__ import annotations

import redis as redis_sync

from streams import role_stats
from streams.keys import Keys


async def test_published_figures_read_back_by_name_async_and_sync(one_redis, one_redis_url):
    keys = Keys("stats")
    await role_stats.publish_generator(one_redis, keys, "gen-a", {"name": "gen-a", "attempts": 3, "reported_ms": 5})
    await role_stats.publish_verifier(one_redis, keys, "w-1", {"worker": "w-1", "processed": 7, "updated_ms": 9})
    assert await role_stats.generators(one_redis, keys) == {"gen-a": {"name": "gen-a", "attempts": 3, "reported_ms": 5}}
    assert await role_stats.verifiers(one_redis, keys) == {"w-1": {"worker": "w-1", "processed": 7, "updated_ms": 9}}
    # the same hashes as plain redis-cli sees them: one field a process, its value a JSON object
    assert await one_redis.hget(keys.generator_stats, "gen-a") == b'{"name":"gen-a","attempts":3,"reported_ms":5}'
    client = redis_sync.Redis.from_url(one_redis_url)
    try:
        assert role_stats.generators_sync(client, keys)["gen-a"]["attempts"] == 3
        assert role_stats.verifiers_sync(client, keys)["w-1"]["processed"] == 7
    finally:
        client.close()


def test_age_reads_each_roles_own_stamp():
    assert role_stats.age_s("generator", {"reported_ms": 1_000}, now_ms=4_000) == 3.0
    assert role_stats.age_s("verifier", {"updated_ms": 1_000}, now_ms=3_500) == 2.5
    assert role_stats.age_s("verifier", {"reported_ms": 1_000}, now_ms=3_000) == 3.0  # no stamp of its own: epoch
