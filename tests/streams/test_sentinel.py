"""Redis Sentinel on the wire: the `redis+sentinel://` URL, a client that follows a
failover, and the settle path's WAIT for a replica. Real processes on 127.0.0.1 (tests/fixtures/sentinel.py:
a master, a replica, three sentinels); the replica is stopped with SIGSTOP where a test needs it slow.

What is asserted about redis-py is read from its 5.3.1 source (redis/asyncio/sentinel.py): a connection asks
the sentinels for the master when it connects, and one to a demoted master that gets READONLY disconnects
and raises ConnectionError("The previous master is now a slave")."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis import exceptions as rx

from streams import sentinel
from streams.codec import encode
from streams.connect import HiredisPacker, HiredisSentinelConnection, NoReplicasError, connect, connect_sync, shown_url
from streams.keys import VERIFIERS, Keys
from streams.ride_out import UNAVAILABLE, RideOut
from streams.runtime import Consumer, ConsumerSettings, ensure_group
from streams.schema import Attempt, Reward
from streams.settings import RoleSettings, SettingsError
from streams.settle import Settlement, Settler
from tests.fixtures.sentinel import SERVICE, started
from tests.fixtures.settling import pending_attempts, settlement


@pytest.fixture
def topology(tmp_path):
    yield from started(tmp_path)


# -- the URL -----------------------------------------------------------------------------------------------


def test_a_sentinel_url_names_the_sentinels_the_service_the_db_and_the_credentials():
    parsed = sentinel.parse(
        "redis+sentinel://app:s%3Acret@10.0.0.1:26380,10.0.0.2,[::1]:5000/main/3"
        "?sentinel_password=sp&socket_timeout=2.5"
    )
    assert parsed.sentinels == [("10.0.0.1", 26380), ("10.0.0.2", 26379), ("::1", 5000)]
    assert (parsed.service, parsed.db, parsed.username, parsed.password) == ("main", 3, "app", "s:cret")
    assert parsed.connection_kwargs() == {"db": 3, "username": "app", "password": "s:cret", "socket_timeout": 2.5}
    assert parsed.sentinel_kwargs() == {"username": None, "password": "sp", "socket_timeout": 2.5}
    assert sentinel.parse("redis+sentinel://h:1/svc").db == 0


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel:///svc", "names no sentinel"),
        ("redis+sentinel://h:26379", "names no service"),
        ("redis+sentinel://h:26379/", "names no service"),
        ("redis+sentinel://h:port/svc", "bad port 'port'"),
        ("redis+sentinel://h:70000/svc", "bad port '70000'"),
        ("redis+sentinel://h:1,,g:2/svc", "has no host"),
        ("redis+sentinel://h:1/svc/zero", "/<service>[/<db number>]"),
        ("redis+sentinel://h:1/svc?sentinel_pasword=x", "option 'sentinel_pasword' is not known"),
        ("redis+sentinel://h:1/svc?socket_timeout=soon", "not a number of seconds"),
    ],
)
def test_a_bad_sentinel_url_is_refused_naming_what_is_wrong(url, says):
    with pytest.raises(ValueError) as e:
        connect(url)
    assert says in str(e.value)
    with pytest.raises(SettingsError) as e:  # and at settings time, before any role starts
        RoleSettings.load(env={"PROOFSTREAM_REDIS_URL": url})
    assert "redis_url" in str(e.value) and says in str(e.value)


def test_shown_url_hides_every_password_of_both_forms():
    assert shown_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert shown_url("redis://h:1/0") == "redis://h:1/0"
    shown = shown_url("redis+sentinel://app:pw1@a:1,b:2/svc/0?sentinel_password=pw2&socket_timeout=1")
    assert "pw1" not in shown and "pw2" not in shown
    assert shown == "redis+sentinel://app:***@a:1,b:2/svc/0?sentinel_password=***&socket_timeout=1"


# -- the client ------------------------------------------------------------------------------------------


async def _connection(client):
    conn = await client.connection_pool.get_connection()
    await client.connection_pool.release(conn)
    return conn


async def _until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = await condition()
        except (rx.ConnectionError, rx.TimeoutError):
            result = None  # the failover under way: the sentinels name no master, or the old one is gone
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)  # polls the state of other processes


async def test_connect_reaches_the_master_through_the_sentinels_with_the_hiredis_packer(topology):
    client = connect(topology.url())
    try:
        await client.set("k", b"\x00bytes\xff")
        assert await client.get("k") == b"\x00bytes\xff"  # bytes in, bytes out
        conn = await _connection(client)
        assert isinstance(conn, HiredisSentinelConnection)
        assert type(conn).pack_command is HiredisPacker.pack_command  # C packing, not redis-py's Python one
        assert conn.port == topology.master.port  # the master the test started, not the replica
    finally:
        await client.aclose()
    blocking = connect_sync(topology.url())  # the health check's and the benchmarks' client
    try:
        assert blocking.get("k") == b"\x00bytes\xff"
    finally:
        blocking.close()


async def test_a_client_follows_a_killed_master_to_the_promoted_replica(topology):
    client = connect(topology.url(), socket_timeout=2)
    try:
        await client.set("before", b"1")
        assert await client.wait(1, 2000) == 1  # on the replica before the master dies
        old = topology.master.port
        topology.master.kill()
        promoted = await asyncio.to_thread(topology.wait_failover, old)
        assert promoted is topology.replica

        async def written():
            await client.set("after", b"2")
            return True

        await _until(written, 30, "a write through the same client after the failover")
        assert (await _connection(client)).port == topology.replica.port
        assert await client.get("before") == b"1"  # what the WAIT saw replicated survived
    finally:
        await client.aclose()


async def test_a_client_that_rides_out_outages_finds_the_promoted_master(topology):
    """arq's pool in workers.py retries for as long as it takes (streams.ride_out): a command sent while the
    master is dead must end on the promoted replica, not knock at the dead address for ever."""
    policy = RideOut(client="test")
    policy.ride_out()
    client = connect(topology.url(), retry=policy, retry_on_error=list(UNAVAILABLE))
    try:
        await client.set("k", b"1")
        old = topology.master.port
        topology.master.kill()
        await asyncio.wait_for(client.set("k", b"2"), 30)  # sent into the outage; answered after the failover
        assert (await _connection(client)).port == topology.replica.port
        assert await client.get("k") == b"2"
    finally:
        await client.aclose()
    assert topology.master_port() != old


@pytest.mark.slow  # a graceful failover takes the sentinels ~10 s
async def test_a_connection_to_a_demoted_master_reconnects_to_the_new_one(topology):
    """SENTINEL FAILOVER leaves the old master running, as a replica. The sentinels close its clients
    (sentinel.c `sentinelSendSlaveOf`: CLIENT KILL TYPE normal after the SLAVEOF); a connection that reaches
    it anyway (a partition healing, a reconnect racing the failover) gets READONLY on its first write, which
    redis-py's sentinel connection turns into a ConnectionError after disconnecting. Both are outages to the
    roles, and both end with the next connect on the new master."""
    client = connect(topology.url(), single_connection_client=True)
    try:
        await client.set("x", b"1")
        old = topology.master.port
        topology.sentinels[0].client.execute_command("SENTINEL", "FAILOVER", SERVICE)
        await asyncio.to_thread(topology.wait_failover, old)
        await _until(
            lambda: asyncio.to_thread(lambda: topology.master.client.info("replication")["role"] == "slave"),
            30,
            "the old master to be a replica",
        )
        with pytest.raises(rx.ConnectionError):
            await client.set("x", b"2")  # the held connection was to the old master: closed by the sentinels
        await client.set("x", b"3")  # the next connect asks the sentinels
        assert client.connection.port == topology.replica.port
        await client.connection.disconnect()
        await client.connection.connect_to(("127.0.0.1", old))  # a connection that reached the demoted master
        with pytest.raises(rx.ConnectionError, match="previous master is now a slave"):
            await client.set("x", b"4")
        await client.set("x", b"5")
        assert client.connection.port == topology.replica.port
        assert await client.get("x") == b"5"
    finally:
        await client.aclose()


# -- WAIT ------------------------------------------------------------------------------------------------

KEYS = Keys("sentinel")


async def _pending_attempts(client, n: int) -> list[tuple[bytes, Attempt]]:
    return await pending_attempts(client, KEYS, n)


def _settlement(entries) -> Settlement:
    return settlement(KEYS, entries)


def _replica_rewards(t) -> list[bytes]:
    return [fields[b"attempt_id"] for _, fields in t.replica.client.xrange(KEYS.rewards)]


async def test_a_settled_batch_is_on_the_replica_when_the_settler_returns(topology):
    client = connect(topology.url())
    try:
        settler = Settler(client, wait_ms=10_000)  # replicas: one when the master has one in sync (default)
        entries = await _pending_attempts(client, 3)
        assert await settler.replication.wanted(KEYS.attempts) == 1
        topology.replica.stop()  # SIGSTOP: the replica takes the stream but applies nothing
        try:
            settling = asyncio.create_task(settler(_settlement(entries)))
            done, _ = await asyncio.wait([settling], timeout=0.3)
            assert not done, "the settle returned while no replica could have the batch"
        finally:
            topology.replica.cont()
        settled = await settling
        assert (settled.published, settled.unreplicated) == (3, False)
        # Read from the replica itself, at once: the WAIT is what made it hold the batch by now.
        assert sorted(_replica_rewards(topology)) == [b"a0", b"a1", b"a2"]
    finally:
        await client.aclose()


@pytest.mark.slow  # a failover: ~3 s
async def test_a_master_paused_through_a_failover_takes_writes_until_deposed_says_so(topology):
    """The split brain, at the client: a master SIGSTOPped until the sentinels promote its replica comes back
    (SIGCONT) still a master, and redis-py's connection made to it before writes there, unrefused (it asks the
    sentinels only when it connects). `sentinel.deposed` asks them: True, the connection is dropped, and the
    next write goes to the promoted replica."""
    client = connect(topology.url())
    try:
        await client.set("k", b"before")
        assert not await sentinel.deposed(client)  # the sentinels name the master this client is on
        old = topology.master
        old.stop()
        await asyncio.to_thread(topology.wait_failover, old.port)
        old.cont()
        await client.set("k", b"split")  # the same connection: to the old master, which still takes writes
        assert old.client.info("replication")["role"] == "master" and old.client.get("k") == b"split"
        assert topology.replica.client.get("k") == b"before"
        assert await sentinel.deposed(client)
        await client.set("k", b"after")
        assert (await _connection(client)).port == topology.replica.port
        assert topology.replica.client.get("k") == b"after"
        assert not await sentinel.deposed(client)  # asked again: nothing new
    finally:
        await client.aclose()


async def _proving_consumer(client) -> Consumer:
    """A consumer of the attempts that rewards each one 1.0, settling with a WAIT of at most 300 ms."""
    await ensure_group(client, KEYS.attempts, VERIFIERS)

    async def handler(delivery):
        a = delivery.message
        return [Reward(a.attempt_id, a.theorem_id, 0, "proved", 1.0)]

    return Consumer(
        client,
        KEYS,
        message_type=Attempt,
        group=VERIFIERS,
        name="c1",
        handler=handler,
        output=Reward,
        settings=ConsumerSettings(batch_size=10, block_ms=50, settle_wait_ms=300),
    )


@pytest.mark.slow  # a failover: ~3 s
async def test_a_consumer_that_settled_on_a_deposed_master_ends_the_batch_as_an_outage(topology):
    """The split brain, at the consumer: its connection to the master paused through a failover still reads
    and settles there once the master comes back; that settle's WAIT finds no replica, the sentinels are
    asked, and the batch ends as an outage would (MasterReplaced, a ConnectionError: the runtime takes what it
    held again from the new master), instead of ~10 s of work thrown away by the demotion. The client holds one
    connection, as the verifier's consumers do (consumers/service.py), which is never released to the pool."""
    client = connect(topology.url(), single_connection_client=True)
    try:
        consumer = await _proving_consumer(client)
        await client.xadd(KEYS.attempts, encode(Attempt("a0", "w", "t", 0, 0, "p")))
        await consumer.run_once()
        assert consumer.stats.published == 1 and consumer.stats.settle_unreplicated == 0  # WAITed for the replica
        old = topology.master
        old.stop()
        await asyncio.to_thread(topology.wait_failover, old.port)
        old.cont()
        await client.xadd(KEYS.attempts, encode(Attempt("a1", "w", "t", 0, 0, "p")))  # to the old master
        assert old.client.info("replication")["role"] == "master" and old.client.xlen(KEYS.attempts) == 2
        with pytest.raises(sentinel.MasterReplaced):
            await consumer.run_once()
        assert consumer.stats.settle_unreplicated == 1
        await client.set("k", b"after")  # the next command: on the new master
        assert topology.replica.client.get("k") == b"after" and old.client.get("k") is None
    finally:
        await client.aclose()


@pytest.mark.parametrize("through", ["sentinel", "redis"])
async def test_a_write_refused_for_want_of_replicas_is_an_outage_that_wrote_nothing(topology, through):
    """`min-replicas-to-write` above the replicas in sync: Redis answers NOREPLICAS, which redis-py 5.3.1 gives
    as a plain ResponseError (no class in redis/_parsers/base.py). Our connections make it a ConnectionError the
    roles ride out, and drop the connection (a sentinel one asks the sentinels again); the settle script was
    refused at its first write, so nothing of it is there and the batch is still pending, to settle again."""
    url = topology.url() if through == "sentinel" else f"redis://127.0.0.1:{topology.master.port}/0"
    client = connect(url)
    try:
        settler = Settler(client, replicas=0)
        entries = await _pending_attempts(client, 3)
        topology.master.client.config_set("min-replicas-to-write", 2)  # one replica there: too few
        conn = await _connection(client)
        with pytest.raises(NoReplicasError, match="NOREPLICAS") as refused:
            await settler(_settlement(entries))
        assert isinstance(refused.value, UNAVAILABLE)
        assert not conn.is_connected  # dropped: the next command connects (and asks the sentinels) again
        assert await client.xlen(KEYS.rewards) == 0
        assert len(await client.xpending_range(KEYS.attempts, VERIFIERS, "-", "+", 10)) == 3
        topology.master.client.config_set("min-replicas-to-write", 0)
        assert (await settler(_settlement(entries))).published == 3
    finally:
        await client.aclose()


async def test_a_wait_that_falls_short_leaves_the_batch_settled_on_the_master_and_counts_it(topology):
    client = connect(topology.url())
    try:
        entries = await _pending_attempts(client, 2)
        topology.replica.stop()
        try:
            settler = Settler(client, replicas=1, wait_ms=300)
            started = time.monotonic()
            settled = await settler(_settlement(entries))
            took_s = time.monotonic() - started
            assert 0.3 <= took_s < 3.0, took_s  # the WAIT's timeout, not the replica's absence, bounds it
            assert (settled.published, settled.unreplicated) == (2, True)
            assert await client.xlen(KEYS.rewards) == 2  # settled on the master: results published, inputs acked
            assert (await client.xpending(KEYS.attempts, VERIFIERS))["pending"] == 0
        finally:
            topology.replica.cont()
        await _until(lambda: asyncio.to_thread(lambda: len(_replica_rewards(topology)) == 2), 10, "replication")
    finally:
        await client.aclose()


async def test_the_consumer_counts_unreplicated_settles_and_auto_mode_stops_waiting_for_a_silent_replica(topology):
    """A stopped replica stays 'connected' to its master until repl-timeout (60 s), so the default mode must
    not ask for it on every batch: after a short WAIT it reads INFO again, and a replica that has not acked
    for over 2 s is not waited for."""
    client = connect(topology.url())
    try:
        consumer = await _proving_consumer(client)
        topology.replica.stop()
        try:
            published = 0

            async def one_fast_settle() -> bool:
                nonlocal published
                await client.xadd(KEYS.attempts, encode(Attempt(f"b{published}", "w", "t", 0, 0, "p")))
                published += 1
                started = time.monotonic()
                await consumer.run_once()
                return time.monotonic() - started < 0.2 and consumer.stats.settle_unreplicated >= 1

            await _until(one_fast_settle, 15, "the settle to stop waiting for the stopped replica")
        finally:
            topology.replica.cont()
        assert consumer.stats.published == published  # every one settled, waited for or not
        assert consumer.stats.settle_unreplicated >= 1
    finally:
        await client.aclose()
