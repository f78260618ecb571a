"""The trainer's checkpoint waits for a replica: the MULTI that writes a version's state
is followed by WAIT on the same connection, so the acks and files that follow it come after a checkpoint that
survives a failover; a WAIT that falls short is counted and the run goes on (trainer/run_state.py `Checkpointer`).
Real processes (tests/fixtures/sentinel.py); the replica is slowed with SIGSTOP."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from streams.connect import connect
from streams.keys import Keys
from tests.fixtures.sentinel import started
from trainer.config import TrainerSettings
from trainer.es import ESRun
from trainer.metrics import MetricsSink
from trainer.run_state import STATE_FIELD


@pytest.fixture
def topology(tmp_path):
    yield from started(tmp_path)


def _run(tmp_path, client, **flags) -> ESRun:
    return ESRun(TrainerSettings(run="ckpt", population=4, **flags), client, [], [], MetricsSink(tmp_path / "run"))


async def test_a_checkpoint_is_on_the_replica_when_it_returns(topology, tmp_path):
    keys = Keys("ckpt")
    client = connect(topology.url())
    try:
        run = _run(tmp_path, client, settle_wait_ms=10_000)
        run.version = 7
        topology.replica.stop()
        try:
            writing = asyncio.create_task(run.checkpoint((keys.policy, {b"v": b"7"})))
            done, _ = await asyncio.wait([writing], timeout=0.3)
            assert not done, "the checkpoint returned while no replica could have it"
        finally:
            topology.replica.cont()
        await writing
        replica = topology.replica.client  # read from the replica itself, at once
        assert orjson.loads(replica.hget(keys.trainer_state, STATE_FIELD))["version"] == 7
        assert [f for _, f in replica.xrange(keys.policy)] == [{b"v": b"7"}]  # the same MULTI's entry
        assert run.counts["checkpoint_unreplicated"] == 0
    finally:
        await client.aclose()


async def test_a_checkpoint_whose_wait_falls_short_is_written_counted_and_the_run_goes_on(topology, tmp_path):
    keys = Keys("ckpt")
    client = connect(topology.url())
    try:
        run = _run(tmp_path, client, settle_replicas=1, settle_wait_ms=300)
        run.version = 3
        topology.replica.stop()
        try:
            started_at = time.monotonic()
            await run.checkpoint()
            assert 0.3 <= time.monotonic() - started_at < 3.0
        finally:
            topology.replica.cont()
        assert run.counts["checkpoint_unreplicated"] == 1
        assert orjson.loads(await client.hget(keys.trainer_state, STATE_FIELD))["version"] == 3  # on the master
    finally:
        await client.aclose()
