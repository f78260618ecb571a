"""WAIT on a Redis Cluster with replicas (tests/fixtures/cluster.py: three masters and a replica of each, real
processes on 127.0.0.1): a settle and a trainer checkpoint go down one connection to the master of the run's
slot, followed by WAIT, so they return once that master's replica has them (streams.cluster `slot_pipeline`,
streams/settle.py, trainer/run_state.py `Checkpointer`). The replica is slowed with SIGSTOP; what it holds is read
from the replica itself (READONLY). A WAIT sent through redis-py's cluster pipeline instead goes to whichever
node it picks for a keyless command, where it counts nothing of the settle's writes."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import orjson
import pytest
import redis as redis_sync

from streams.connect import connect
from streams.keys import Keys
from streams.schema import Attempt
from streams.settle import Settlement, Settler
from tests.fixtures.cluster import LocalCluster
from tests.fixtures.settling import pending_attempts, settlement
from trainer.config import TrainerSettings
from trainer.es import ESRun
from trainer.metrics import MetricsSink
from trainer.run_state import STATE_FIELD

pytestmark = pytest.mark.timeout(120)

RUN = "waits"
KEYS = Keys(RUN)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("replicated"), replicas=1) as c:
        yield c


@pytest.fixture
def replica(cluster):
    """The port of the replica of the master serving the run's slot, asked of that master."""
    master = cluster.port_of_slot(cluster.keyslot(KEYS.prefix))
    with redis_sync.Redis(port=master) as node:
        node.flushall()
        info = node.info("replication")
    [port] = [int(v["port"]) for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return port


class paused:
    """SIGSTOP a node for the block: it stays connected and applies nothing."""

    def __init__(self, cluster: LocalCluster, port: int) -> None:
        self.pid = cluster.procs[port].pid

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *exc) -> None:
        os.kill(self.pid, signal.SIGCONT)


def on_replica(port: int) -> redis_sync.Redis:
    node = redis_sync.Redis(port=port, single_connection_client=True)
    node.execute_command("READONLY")  # a cluster replica answers reads of its master's slots only after it
    return node


async def _pending_attempts(client, n: int) -> list[tuple[bytes, Attempt]]:
    return await pending_attempts(client, KEYS, n)


def _settlement(entries) -> Settlement:
    return settlement(KEYS, entries)


async def test_a_settle_returns_once_the_slot_masters_replica_has_it(cluster, replica):
    client = connect(cluster.url)
    try:
        settler = Settler(client, wait_ms=10_000)  # auto: one, read from the slot master's INFO
        entries = await _pending_attempts(client, 3)
        assert await settler.replication.wanted(KEYS.attempts) == 1
        with paused(cluster, replica):
            settling = asyncio.create_task(settler(_settlement(entries)))
            done, _ = await asyncio.wait([settling], timeout=0.3)
            assert not done, "the settle returned while no replica could have the batch"
        settled = await settling
        assert (settled.published, settled.unreplicated) == (3, False)
        with on_replica(replica) as node:  # at once: the WAIT is what made it hold the batch by now
            assert sorted(f[b"attempt_id"] for _, f in node.xrange(KEYS.rewards)) == [b"a0", b"a1", b"a2"]
    finally:
        await client.aclose()


async def test_a_settle_whose_replica_is_away_is_settled_and_counted_unreplicated(cluster, replica):
    client = connect(cluster.url)
    try:
        settler = Settler(client, replicas=1, wait_ms=300)
        entries = await _pending_attempts(client, 2)
        with paused(cluster, replica):
            started_at = time.monotonic()
            settled = await settler(_settlement(entries))
            assert 0.3 <= time.monotonic() - started_at < 3.0
        assert (settled.published, settled.unreplicated) == (2, True)
        assert await client.xlen(KEYS.rewards) == 2  # on the master: settled, not undone
    finally:
        await client.aclose()


async def test_a_trainer_checkpoint_returns_once_the_slot_masters_replica_has_it(cluster, replica, tmp_path):
    client = connect(cluster.url)
    try:
        run = ESRun(
            TrainerSettings(run=RUN, population=4, settle_wait_ms=10_000), client, [], [], MetricsSink(tmp_path / "run")
        )
        run.version = 7
        with paused(cluster, replica):
            writing = asyncio.create_task(run.checkpoint((KEYS.policy, {b"v": b"7"})))
            done, _ = await asyncio.wait([writing], timeout=0.3)
            assert not done, "the checkpoint returned while no replica could have it"
        await writing
        with on_replica(replica) as node:
            assert orjson.loads(node.hget(KEYS.trainer_state, STATE_FIELD))["version"] == 7
            assert [f for _, f in node.xrange(KEYS.policy)] == [{b"v": b"7"}]  # the same MULTI's entry
        assert run.counts["checkpoint_unreplicated"] == 0
    finally:
        await client.aclose()
