"""The wire on a real Redis Cluster (three masters on 127.0.0.1, tests/fixtures/cluster.py): a
`redis+cluster://` URL gives a cluster client, a run's keys share one slot, scripts and transactions run on
it, runs spread over the masters, and a slot that moves under a transaction applies nothing.

Slots and owners are the servers' answers (CLUSTER KEYSLOT, CLUSTER SLOTS, COUNTKEYSINSLOT on each node),
never redis-py's own computation, which the code under test uses.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis as redis_sync
from redis import exceptions as rx
from redis.asyncio.connection import SSLConnection

from evals.runs import EvalError, find_run
from streams.cluster import (
    ClusterClient,
    ClusterUnavailable,
    SlotMoved,
    on_slot,
    parse_cluster_url,
    transaction,
)
from streams.codec import decode
from streams.connect import HiredisPackedConnection, connect, connect_sync, shown_url
from streams.groups import group_states
from streams.keys import VERIFIERS, Keys
from streams.publisher import Publisher
from streams.runtime import Consumer, ConsumerSettings, Delivery, ensure_group
from streams.schema import Attempt, Reward
from streams.settle import Replication
from trainer.config import TrainerSettings
from trainer.lease import TrainerLease, TrainerRunning

ROOT = Path(__file__).resolve().parents[2]


def run_on(cluster, port: int, avoid: set[str] = frozenset(), stem: str = "r") -> str:
    """A run id whose `{ps:R}` slot the server says is served by the master on `port`."""
    for i in range(10_000):
        run = f"{stem}{i}"
        if run not in avoid and cluster.port_of_slot(cluster.keyslot(Keys(run).prefix)) == port:
            return run
    raise AssertionError(f"no run id on {port}")


def keys_in_slot(port: int, slot: int) -> int:
    with redis_sync.Redis(port=port) as node:
        return int(node.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))


@pytest.fixture
async def cluster_client(redis_cluster):
    client = connect(redis_cluster.url)
    yield client
    await client.aclose()


def test_a_cluster_url_parses_and_hides_its_password():
    seeds, options = parse_cluster_url("redis+cluster://u:p%40ss@h1:7000,h2:7001/0?socket_timeout=3")
    assert seeds == [("h1", 7000), ("h2", 7001)]
    assert options == {"username": "u", "password": "p@ss", "socket_timeout": 3.0}
    assert shown_url("redis+cluster://u:p%40ss@h1:7000,h2:7001") == "redis+cluster://u:***@h1:7000,h2:7001"
    assert shown_url("redis+cluster://:secret@h1:7000,h2:7001") == "redis+cluster://:***@h1:7000,h2:7001"
    for bad in ("redis+cluster://h1:7000/2", "redis+cluster://", "redis+cluster://h1"):
        with pytest.raises(ValueError):
            parse_cluster_url(bad)
    # TLS keeps redis-py's SSLConnection (the packer is for plain TCP); nothing connects before a command.
    tls = connect("rediss+cluster://h1:7000")
    assert tls.connection_kwargs["connection_class"] is SSLConnection
    assert {n.connection_class for n in tls.nodes_manager.startup_nodes.values()} == {SSLConnection}


async def test_connect_gives_a_cluster_client_with_the_hiredis_packer_and_bytes(redis_cluster, cluster_client):
    keys = Keys("packer")
    assert isinstance(cluster_client, ClusterClient)
    await cluster_client.set(keys.es_noise, "cpu")
    assert await cluster_client.get(keys.es_noise) == b"cpu"  # bytes: the codec decodes
    connections = [c for node in cluster_client.get_nodes() for c in node._connections]
    assert connections and all(type(c) is HiredisPackedConnection for c in connections)
    # The node that answered is the one the server says holds the slot.
    node = await cluster_client.node_of(keys.prefix)
    assert node.port == redis_cluster.port_of_slot(redis_cluster.keyslot(keys.prefix))


def test_every_key_of_a_run_is_on_the_run_slot(redis_cluster):
    keys = Keys("one-slot")
    # Every key property of Keys (a key added later is covered too), a done marker, and the keys arq 0.28
    # writes for workers.verifier (queue, health check, the cron jobs' job/in-progress/retry/result keys,
    # the abort set as workers.py names it on a cluster).
    names = [getattr(keys, n) for n, v in vars(Keys).items() if isinstance(v, property) and n != "prefix"]
    assert keys.trainer_lease in names and keys.verdicts in names
    names += [
        *keys.streams().values(),
        keys.done("a1:0"),
        f"{keys.prefix}:arq",
        f"{keys.prefix}:arq:health-check",
        f"arq:job:{keys.prefix}:sweep:1700000000000",
        f"arq:in-progress:{keys.prefix}:report:1",
        f"arq:retry:{keys.prefix}:sweep:1",
        f"arq:result:{keys.prefix}:sweep:1",
        f"{keys.prefix}:arq:abort",
    ]
    assert {redis_cluster.keyslot(n) for n in names} == {redis_cluster.keyslot(keys.prefix)}
    assert redis_cluster.keyslot("arq:abort") != redis_cluster.keyslot(keys.prefix)  # why workers.py moves it


async def test_runs_spread_over_the_masters(redis_cluster, cluster_client):
    runs = [run_on(redis_cluster, port, stem=f"spread{port}-") for port in redis_cluster.ports]
    for run in runs:
        await cluster_client.hset(Keys(run).trainer_state, "state", b"{}")
    # Each run's key is on its own master, as that server counts its slot's keys.
    held = {}
    for run in runs:
        slot = redis_cluster.keyslot(Keys(run).prefix)
        owners = [p for p in redis_cluster.ports if keys_in_slot(p, slot)]
        assert len(owners) == 1
        held[run] = owners[0]
    assert len(set(held.values())) == 3
    # A scan finds them on every master (SCAN goes to each primary: redis/cluster.py COMMAND_FLAGS).
    found = {k async for k in cluster_client.scan_iter(match="{ps:spread*}:trainer")}
    assert found == {Keys(run).trainer_state.encode() for run in runs}
    # evals' run lookup scans so too: a run it does not hold is refused naming every run, on every master.
    with pytest.raises(EvalError) as refused:
        await find_run(cluster_client, TrainerSettings(run="absent"))
    assert all(repr(run) in str(refused.value) for run in runs), str(refused.value)


async def test_server_commands_reach_the_run_master(redis_cluster, cluster_client):
    # Not the default node (the first master redis-py found): a run on each of the others.
    default = cluster_client.get_default_node() or (await cluster_client.initialize()).get_default_node()
    for port in (p for p in redis_cluster.ports if p != default.port):
        keys = Keys(run_on(redis_cluster, port, stem="server-"))
        info = await cluster_client.info("server", **await on_slot(cluster_client, keys.prefix))
        assert info["tcp_port"] == port


async def test_publish_consume_settle_and_claim_scripts_on_the_cluster(redis_cluster, cluster_client):
    keys = Keys(run_on(redis_cluster, redis_cluster.ports[-1], stem="wire-"))
    await ensure_group(cluster_client, keys.attempts, VERIFIERS)
    attempts = [
        Attempt(
            attempt_id=f"a{i}",
            work_id="w",
            theorem_id="t",
            policy_version=0,
            sample_index=i,
            proof="POISON" if i % 10 == 3 else f"p{i}",
        )
        for i in range(60)
    ]
    # Publisher's pipeline stages with pipeline_execute_command: the cluster pipeline must take it.
    ids = await Publisher(cluster_client, keys).publish(attempts)
    assert len(ids) == 60
    await Publisher(cluster_client, keys).publish(attempts[:5])  # republished: the done markers absorb them

    async def handle(d: Delivery[Attempt]) -> list[Reward]:
        if d.message.proof == "POISON":
            from streams.runtime import Poison  # noqa: PLC0415

            raise Poison("poison")
        await asyncio.sleep(0.001)
        return [
            Reward(
                attempt_id=d.message.attempt_id,
                theorem_id="t",
                policy_version=0,
                verdict="proved",
                reward=1.0,
                work_id="w",
                sample_index=d.message.sample_index,
                sandbox_id="x",
            )
        ]

    settings = ConsumerSettings(batch_size=8, block_ms=100, claim_idle_ms=600, claim_refresh_ms=100, retry_delay_ms=300)
    consumers = [
        Consumer(
            connect(redis_cluster.url),
            keys,
            message_type=Attempt,
            group=VERIFIERS,
            name=f"c{i}",
            handler=handle,
            output=Reward,
            settings=settings,
        )
        for i in range(2)
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in consumers]
    deadline = time.monotonic() + 30
    while (await group_states(cluster_client, keys.attempts))[0].outstanding:
        assert time.monotonic() < deadline, "not settled in time"
        assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
        await asyncio.sleep(0.05)  # polls an observable condition
    stop.set()
    await asyncio.gather(*tasks)
    for c in consumers:
        await c.redis.aclose()
    rewards = [decode(Reward, f).attempt_id for _, f in await cluster_client.xrange(keys.rewards)]
    assert sorted(rewards) == sorted(a.attempt_id for a in attempts if a.proof != "POISON")
    # Each poison entry dead-lettered once: six, and a3's republished entry.
    assert await cluster_client.xlen(keys.dlq) == 7
    assert_run_on_its_slot(redis_cluster, keys)


def assert_run_on_its_slot(cluster, keys: Keys) -> None:
    """Every key of the run (done markers included) is on its slot's master, and on no other."""
    slot = cluster.keyslot(keys.prefix)
    port = cluster.port_of_slot(slot)
    for p in cluster.ports:
        with redis_sync.Redis(port=p) as node:
            names = node.keys(f"*{keys.prefix}*")
        if p == port:
            assert len(names) == keys_in_slot(port, slot) > 0
            assert {cluster.keyslot(n.decode()) for n in names} == {slot}
        else:
            assert names == []


async def test_no_wait_without_replicas_on_a_cluster(cluster_client):
    """Auto mode asks the master of the run's slot, which has no replica here: nobody is waited for. With
    replicas: tests/test_cluster_replicas.py."""
    keys = Keys("r0")
    assert await Replication(cluster_client).wanted(keys.attempts) == 0
    assert await Replication(cluster_client, 0).wanted(keys.attempts) == 0
    assert await Replication(cluster_client, 1).wanted(keys.attempts) == 1  # the operator's count, as it is


async def test_the_trainer_lease_script_on_the_cluster(redis_cluster, cluster_client):
    keys = Keys(run_on(redis_cluster, redis_cluster.ports[1], stem="lease-"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    holder = {"host": os.uname().nodename, "pid": dead.pid, "token": "t", "since": 0}
    await cluster_client.set(keys.trainer_lease, orjson.dumps(holder), px=60_000)
    lease = TrainerLease(cluster_client, keys, ttl_s=2)
    await lease.acquire()  # the holder's pid is gone: the swap script takes the lease over
    try:
        assert orjson.loads(await cluster_client.get(keys.trainer_lease))["pid"] == os.getpid()
        with pytest.raises(TrainerRunning):
            await TrainerLease(connect(redis_cluster.url), keys, ttl_s=0.5).acquire()
    finally:
        await lease.release()
    assert await cluster_client.get(keys.trainer_lease) is None


async def test_a_transaction_on_the_run_slot_is_all_or_nothing(redis_cluster, cluster_client):
    keys = Keys(run_on(redis_cluster, redis_cluster.ports[2], stem="multi-"))
    async with transaction(cluster_client, keys.trainer_state) as pipe:
        pipe.xadd(keys.metrics, {b"json": b"{}"})
        pipe.hset(keys.trainer_state, "state", b"1")
        await pipe.execute()
    assert await cluster_client.hget(keys.trainer_state, "state") == b"1"
    assert await cluster_client.xlen(keys.metrics) == 1
    # A key of another slot in it (on another master): Redis discards all of it; a bug, not a move.
    other = Keys(run_on(redis_cluster, redis_cluster.ports[0], stem="multi-other-"))
    with pytest.raises(rx.ResponseError) as caught:
        async with transaction(cluster_client, keys.trainer_state) as pipe:
            pipe.hset(keys.trainer_state, "state", b"2")
            pipe.hset(other.trainer_state, "state", b"2")
            await pipe.execute()
    assert not isinstance(caught.value, SlotMoved)
    # Another slot on the same master: CROSSSLOT, all of it discarded too.
    same = Keys(run_on(redis_cluster, redis_cluster.ports[2], avoid={keys.run}, stem="multi-same-"))
    with pytest.raises(rx.ResponseError, match="CROSSSLOT"):
        async with transaction(cluster_client, keys.trainer_state) as pipe:
            pipe.hset(keys.trainer_state, "state", b"3")
            pipe.hset(same.trainer_state, "state", b"3")
            await pipe.execute()
    assert await cluster_client.hget(keys.trainer_state, "state") == b"1"
    assert await cluster_client.exists(other.trainer_state, same.trainer_state) == 0
    # The same on redis-py's own cluster pipeline: it refuses a transaction.
    with pytest.raises(rx.RedisClusterException):
        cluster_client.pipeline(transaction=True)


async def test_a_slot_moved_under_a_transaction_applies_nothing_and_the_retry_lands(redis_cluster):
    client = connect(redis_cluster.url)
    try:
        keys = Keys(run_on(redis_cluster, redis_cluster.ports[0], stem="moving-"))
        slot = redis_cluster.keyslot(keys.prefix)
        await client.node_of(keys.prefix)  # the client's slot table: slot on ports[0]
        target = redis_cluster.ports[1]
        move_empty_slot(redis_cluster, slot, target)
        with pytest.raises(SlotMoved):
            async with transaction(client, keys.trainer_state) as pipe:
                pipe.xadd(keys.metrics, {b"json": b"{}"})
                pipe.hset(keys.trainer_state, "state", b"1")
                await pipe.execute()
        assert keys_in_slot(redis_cluster.ports[0], slot) == keys_in_slot(target, slot) == 0  # nothing applied
        async with transaction(client, keys.trainer_state) as pipe:  # the ride-out's retry: the new master
            pipe.xadd(keys.metrics, {b"json": b"{}"})
            pipe.hset(keys.trainer_state, "state", b"1")
            await pipe.execute()
        assert keys_in_slot(target, slot) == 2
    finally:
        await client.aclose()


def move_empty_slot(cluster, slot: int, port: int) -> None:
    """Give an empty `slot` to the master on `port` (CLUSTER SETSLOT ... NODE on every master, the new owner
    first, as the cluster tutorial's resharding ends), then wait until every node agrees."""
    ids = {}
    for p in cluster.ports:
        with redis_sync.Redis(port=p) as node:
            ids[p] = node.execute_command("CLUSTER", "MYID").decode()
    for p in [port, *(q for q in cluster.ports if q != port)]:
        with redis_sync.Redis(port=p) as node:
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[port])
    deadline = time.monotonic() + 10
    while True:
        owners = set()
        for p in cluster.ports:
            with redis_sync.Redis(port=p) as node:
                for first, last, master, *_ in node.execute_command("CLUSTER", "SLOTS"):
                    if int(first) <= slot <= int(last):
                        owners.add(int(master[1]))
        if owners == {port}:
            return
        assert time.monotonic() < deadline, f"slot {slot} owners: {owners}"
        time.sleep(0.05)  # polls an observable condition


def test_a_synchronous_client_and_the_health_check_on_a_cluster(redis_cluster):
    keys = Keys(run_on(redis_cluster, redis_cluster.ports[1], stem="health-"))
    with connect_sync(redis_cluster.url) as client:
        worker = f"{socket.gethostname()}-1"  # ops.health looks for this container's workers
        client.hset(keys.verifier_stats, worker, orjson.dumps({"worker": worker, "updated_ms": time.time() * 1000}))
    env = {**os.environ, "PROOFSTREAM_REDIS_URL": redis_cluster.url, "PROOFSTREAM_RUN": keys.run}
    out = subprocess.run(
        [sys.executable, "-m", "ops.health", "verifier"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "healthy"


async def test_a_cluster_that_is_down_is_an_outage_and_the_client_rides_it_out(redis_cluster):
    """A master down past the node timeout: the others say CLUSTERDOWN for every slot, the run's too. The
    client raises that as a ConnectionError (what the roles ride out), and works again once it is back."""
    client = connect(redis_cluster.url)
    try:
        keys = Keys(run_on(redis_cluster, redis_cluster.ports[0], stem="down-"))
        await client.set(keys.es_noise, "cpu")
        victim = redis_cluster.ports[2]
        redis_cluster.kill(victim)
        try:
            deadline = time.monotonic() + 30
            while redis_cluster.state(redis_cluster.ports[0]) != "fail":
                assert time.monotonic() < deadline, "the cluster did not mark the killed master as failing"
                await asyncio.sleep(0.1)  # polls an observable condition
            with pytest.raises(rx.ConnectionError) as caught:
                await client.get(keys.es_noise)
            assert isinstance(caught.value, ClusterUnavailable) and "cluster is down" in str(caught.value)
        finally:
            redis_cluster.restart(victim)
        assert await client.get(keys.es_noise) == b"cpu"
    finally:
        await client.aclose()


async def test_a_client_finds_a_restarted_one_master_cluster_again(tmp_path):
    """Its only seed refused a connection, so redis-py dropped it from the startup nodes; the URL's seeds are
    put back, and a cluster with no node answering is a ConnectionError, not a bare RedisClusterException."""
    from tests.fixtures.cluster import LocalCluster  # noqa: PLC0415

    with LocalCluster(tmp_path, masters=1) as one:
        client = connect(one.url)
        try:
            await client.set("{ps:solo}:es_noise", "cpu")
            one.kill(one.ports[0])
            for _ in range(2):  # the first drops the node, the second finds no seed left (without the fix)
                with pytest.raises(rx.ConnectionError):
                    await client.get("{ps:solo}:es_noise")
            one.restart(one.ports[0])
            assert await client.get("{ps:solo}:es_noise") == b"cpu"
        finally:
            await client.aclose()
