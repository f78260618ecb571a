"""streams.ride_out.RideOut through arq's own pool (arq.connections.create_pool, as `arq workers.verifier`
builds it) against a real redis-server killed with SIGKILL and restarted on the same port."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from arq.connections import RedisSettings, create_pool
from redis import exceptions as rx

from streams.embedded import EmbeddedRedis
from streams.ride_out import UNAVAILABLE, RideOut


@pytest.fixture
def server():
    with EmbeddedRedis() as s:
        yield s


def settings(url: str, retry: RideOut) -> RedisSettings:
    return dataclasses.replace(RedisSettings.from_dsn(url), retry=retry, retry_on_error=list(UNAVAILABLE))


async def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.05)  # polls an observable condition


class Stderr:
    """What was logged so far (streams.logs writes JSON lines to the stderr of the moment)."""

    def __init__(self, capsys) -> None:
        self.capsys = capsys
        self.text = ""

    def has(self, event: str) -> bool:
        self.text += self.capsys.readouterr().err
        return f'"{event}"' in self.text


@pytest.fixture
async def arq(server):
    """arq's own pool with a RideOut policy, as `arq workers.verifier` builds it: (policy, pool)."""
    retry = RideOut(client="arq")
    pool = await create_pool(settings(server.url, retry))
    yield retry, pool
    await pool.aclose()


async def waiting(call, capsys) -> asyncio.Task:
    """`call` started while Redis is down, once it has failed a first time (RideOut logs it) and waits on."""
    logged = Stderr(capsys)
    task = asyncio.create_task(call)
    await wait_for(lambda: logged.has("redis_unavailable") or task.done(), 30, "the first failed try")
    assert not task.done(), task.exception()
    return task


async def test_the_pool_shares_one_policy_so_a_state_change_reaches_every_connection(arq):
    retry, pool = arq
    # redis-py deep-copies the policy into the client and into each connection: they must stay one.
    assert pool.get_retry() is retry
    assert (await pool.connection_pool.get_connection()).retry is retry


async def test_starting_gives_up_at_the_first_failure_so_arq_decides_with_its_conn_retries(server, arq):
    _, pool = arq
    server.kill()
    started = time.monotonic()
    with pytest.raises(rx.ConnectionError):
        await asyncio.wait_for(pool.ping(), 30)  # a policy that retried would wait for Redis: TimeoutError
    assert time.monotonic() - started < 5  # no backoff at all; the bound only keeps a loaded machine green


async def test_riding_out_waits_for_redis_to_come_back_on_the_same_connection_pool(server, arq, capsys):
    retry, pool = arq
    retry.ride_out()
    await pool.set("k", "before")  # a live connection, idle in the pool when the server dies
    server.kill()
    for _ in range(3):  # let the loop take in the connection's EOF, as arq's between two polls: the pool
        await asyncio.sleep(0)  # then reconnects outside the command's retry, in `connect`'s own
    get = await waiting(pool.get("k"), capsys)
    server.start()
    assert await asyncio.wait_for(get, 30) == b"before"  # the AOF kept it


async def test_stopping_bounds_a_call_that_is_already_waiting(server, arq, capsys):
    retry, pool = arq
    retry.ride_out()
    server.kill()
    ping = await waiting(pool.ping(), capsys)
    retry.stop_within(0.5)
    with pytest.raises(rx.ConnectionError):
        await asyncio.wait_for(ping, 30)  # the grace plus one backoff at most; 30 s only if it never ends
