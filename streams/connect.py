"""The one way roles open a Redis client: bytes in and out, commands packed by hiredis.

redis-py's asyncio connection packs every command argument in Python (its sync twin already uses
`hiredis.pack_command`); on the wire benchmark that packing was 64% of the runtime's time. Packing in C
is the same RESP bytes, so the connection classes below change speed only.

Two kinds of URL (a small dispatch on the scheme; `PROOFSTREAM_REDIS_URL` takes either):
- `redis://[user:password@]host:port/db` (and `rediss://`, `unix://`): one server, as redis-py reads it.
- `redis+sentinel://[user:password@]host1:port1,host2:port2/<service>[/<db>][?sentinel_password=...]`:
  the sentinels and the service they monitor; the client talks to whichever server is the master and
  follows a failover (streams/sentinel.py has the format and how the client follows).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit

import hiredis
import redis as redis_sync
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import SentinelManagedConnection
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError

from streams import sentinel
from streams.cluster import connect_cluster, connect_cluster_sync, is_cluster_url


class HiredisPacker:
    """`pack_command` in C, for any redis-py asyncio connection class (placed before it in the bases)."""

    def pack_command(self, *args) -> list[bytes]:
        # Same splitting of multi-word command names ("XINFO GROUPS") as redis-py's own packers.
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError as e:
            raise DataError(str(e)) from e


class NoReplicasError(RedisConnectionError):
    """A master refused a write for want of replicas (`min-replicas-to-write`): an outage, not a bug."""


class NoReplicasIsAnOutage:
    """NOREPLICAS becomes a ConnectionError, after a disconnect, for any redis-py asyncio connection class
    (placed before it in the bases).

    A master with `min-replicas-to-write N` answers every write `-NOREPLICAS` while fewer than N replicas are
    in sync: it lost its replica, or it is an old master that was paused or cut off while the sentinels
    promoted its replica, and came back still believing it is the master (a sentinel waits 8 s before it
    demotes it: sentinel.c `sentinelRefreshInstanceInfo`, SENTINEL_PUBLISH_PERIOD*4). redis-py 5.3.1 has no
    class for that error (redis/_parsers/base.py `EXCEPTION_CLASSES`): a plain ResponseError, which the roles
    take for a bug; arq's loop and every consumer of `arq workers.verifier` ended on it (tests/test_failover.py,
    `pause-min-replicas`). Nothing was written (Redis refuses a script at its first write and a transaction
    whole, so a settle or a checkpoint is refused entire), so it is safe to retry, and the roles ride it out as
    they ride out a restart. The disconnect is what redis-py does for READONLY (redis/asyncio/sentinel.py
    `SentinelManagedConnection.read_response`): a sentinel connection's next connect asks the sentinels again
    and finds the promoted master instead of writing on to the old one."""

    async def read_response(self, *args, **kwargs):
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as e:
            if not str(e).startswith("NOREPLICAS"):
                raise
            await self.disconnect()
            raise NoReplicasError(str(e)) from e


class HiredisPackedConnection(HiredisPacker, NoReplicasIsAnOutage, Connection):
    pass


class HiredisSentinelConnection(HiredisPacker, NoReplicasIsAnOutage, SentinelManagedConnection):
    """The sentinel pool's connection (`SentinelConnectionPool` takes it as `connection_class`).

    One try per address. redis-py runs a connection's retry policy at three levels (redis/asyncio, 5.3.1): the
    command (client.py `execute_command`), the sentinel connect that asks the sentinels for the master
    (sentinel.py `SentinelManagedConnection.connect` -> `_connect_retry`), and the connect to the one address
    they named (`connect_to` -> connection.py `AbstractConnection.connect`). With a counted `Retry` the
    innermost gives up and the middle one asks again; with a policy that retries for as long as it takes
    (streams.ride_out, arq's pool in workers.py) the innermost would knock at a dead master's address for
    ever, and never ask the sentinels for the promoted one (seen in tests/test_failover.py: the worker's
    health key never came back). So the address gets one try, and the policy retries the whole connect."""

    async def connect_to(self, address) -> None:
        policy, self.retry = self.retry, _ONE_TRY  # the callers above hold the policy itself, not this attribute
        try:
            await super().connect_to(address)
        finally:
            self.retry = policy


_ONE_TRY = Retry(NoBackoff(), 0)


def connect(url: str, **kwargs) -> Redis:
    """Async client for `url`, with the hiredis packer and bytes responses (the codec decodes).

    `redis+sentinel://` gives the master a sentinel names (streams/sentinel.py); `redis+cluster://
    host:port[,host:port...]` a Redis Cluster client (streams/cluster.py)."""
    if sentinel.is_sentinel(url):
        return sentinel.master(url, connection_class=HiredisSentinelConnection, **kwargs)
    if is_cluster_url(url):
        return connect_cluster(url, HiredisPackedConnection, **kwargs)
    return Redis.from_url(url, connection_class=HiredisPackedConnection, **kwargs)


def connect_sync(url: str, **kwargs) -> redis_sync.Redis:
    """Blocking client for `url` (health checks, benchmarks' bookkeeping); redis-py's sync connection packs
    with hiredis already."""
    if sentinel.is_sentinel(url):
        return sentinel.master_sync(url, **kwargs)
    if is_cluster_url(url):
        return connect_cluster_sync(url, **kwargs)
    return redis_sync.Redis.from_url(url, **kwargs)


_SECRET_OPTIONS = ("password", "sentinel_password")


def shown_url(url: str) -> str:
    """The URL without its passwords (the user's, and a sentinel URL's `sentinel_password`), for messages
    and reports; a sentinel's or cluster's list of hosts included."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    query = parse_qsl(parts.query, keep_blank_values=True)
    secret_options = any(k in _SECRET_OPTIONS for k, _ in query)
    if not (at and ":" in userinfo) and not secret_options:
        return url
    if at and ":" in userinfo:
        parts = parts._replace(netloc=f"{userinfo.partition(':')[0]}:***@{hosts}")
    if secret_options:
        masked = [(k, "***" if k in _SECRET_OPTIONS else v) for k, v in query]
        parts = parts._replace(query=urlencode(masked, safe="*"))
    return parts.geturl()
