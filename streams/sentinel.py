"""Redis Sentinel: the `redis+sentinel://` URL and the clients it opens, which follow a failover.

    redis+sentinel://[user:password@]host1[:port1],host2[:port2],.../<service>[/<db>][?option=value&...]

The hosts are the sentinels (port 26379 when left out), `service` the name they monitor (`sentinel monitor
<service> ...`), `db` the database (0). The user and password are the data nodes' (master and replicas).
Options: `sentinel_username`, `sentinel_password` (the sentinels' own AUTH, when they have one: Redis keeps
the two apart, `requirepass` of a sentinel is its own), `socket_timeout`, `socket_connect_timeout` (seconds,
for the data nodes and the sentinels alike). Anything else is an error, so a typo is not ignored.

How a client follows a failover (redis-py 5.3.1, redis/asyncio/sentinel.py): every new connection asks the
sentinels for the master first (`SentinelManagedConnection._connect_retry` -> `SentinelConnectionPool.
get_master_address` -> `Sentinel.discover_master`, which skips a sentinel that does not answer and a master
a sentinel sees as down: `MasterNotFoundError`, a ConnectionError). A connection to a master that was demoted
and still answers gets READONLY on its next write; `SentinelManagedConnection.read_response` then disconnects
and raises ConnectionError("The previous master is now a slave"), so the next connect asks the sentinels
again. A killed master is a reset or refused connection. Either way the caller sees a ConnectionError, which
every role already rides out as an outage (streams.runtime, streams.ride_out, the trainer's reset from the
run's state): a failover is a restart whose Redis comes back at another address.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis as redis_sync
import redis.sentinel as sentinel_sync
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

SCHEME = "redis+sentinel"
DEFAULT_PORT = 26379
_FLOAT_OPTIONS = ("socket_timeout", "socket_connect_timeout")
_STR_OPTIONS = ("sentinel_username", "sentinel_password")
_CLIENT_ONLY = ("single_connection_client",)  # Redis() arguments, not connection arguments


@dataclass(frozen=True)
class SentinelURL:
    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def _socket(self, given: dict[str, Any]) -> dict[str, Any]:
        """The URL's timeouts, overridden by those a caller gives (ops' --timeout-s): for both kinds of node."""
        return {k: given.get(k, self.options.get(k)) for k in _FLOAT_OPTIONS if k in given or k in self.options}

    def connection_kwargs(self) -> dict[str, Any]:
        """For the data nodes' connections."""
        return {"db": self.db, "username": self.username, "password": self.password, **self._socket({})}

    def sentinel_kwargs(self, given: dict[str, Any] | None = None) -> dict[str, Any]:
        """For the connections to the sentinels: the socket options, and their own credentials."""
        return {
            "username": self.options.get("sentinel_username"),
            "password": self.options.get("sentinel_password"),
            **self._socket(given or {}),
        }


def is_sentinel(url: str) -> bool:
    return url.startswith(SCHEME + "://")


def parse(url: str) -> SentinelURL:
    """The parts of a `redis+sentinel://` URL; a ValueError that names what is wrong otherwise."""
    if not is_sentinel(url):
        raise ValueError(f"a sentinel URL starts with {SCHEME}://")
    rest = url[len(SCHEME) + 3 :]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(secret) if colon else None
    if not hosts:
        raise ValueError(f"{SCHEME} URL names no sentinel: give host:port[,host:port...] before the service name")
    sentinels = [_host_port(h) for h in hosts.split(",")]
    parts = [unquote(p) for p in path.split("/")] if path else []
    if not parts or not parts[0]:
        raise ValueError(
            f"{SCHEME} URL names no service: end it with /<service name> (the name the sentinels "
            "monitor), e.g. /mymaster or /mymaster/0"
        )
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError(f"{SCHEME} URL path must be /<service>[/<db number>], not /{path}")
    db = int(parts[1]) if len(parts) == 2 else 0
    return SentinelURL(sentinels, parts[0], db, username, password, _options(query))


def _host_port(text: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise ValueError(f"{SCHEME} URL: sentinel {text!r} has no host (empty entry in the host list?)")
    if not port:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{SCHEME} URL: sentinel {text!r} has a bad port {port!r} (a number 1-65535)")
    return host, int(port)


def _options(query: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in _FLOAT_OPTIONS:
            try:
                out[key] = float(value)
            except ValueError:
                raise ValueError(f"{SCHEME} URL option {key}={value!r} is not a number of seconds") from None
        elif key in _STR_OPTIONS:
            out[key] = value
        else:
            known = ", ".join((*_STR_OPTIONS, *_FLOAT_OPTIONS))
            raise ValueError(f"{SCHEME} URL option {key!r} is not known; the options are {known}")
    return out


class MasterReplaced(RedisConnectionError):
    """This client wrote to a server the sentinels no longer name as the master (`deposed`): an outage."""


class _ClosingPool(SentinelConnectionPool):
    """Closes the clients of the sentinels with the pool: `Sentinel` opens one per sentinel and nothing else
    closes them (redis/asyncio/sentinel.py), so a closed client would leave their sockets to the GC.

    Also drops, when it comes back, a connection to an address other than the master the pool last heard of
    from the sentinels (`master_address`), as redis-py's blocking pool does (redis/connection.py
    `ConnectionPool.release` -> `owns_connection`) and its asyncio pool of 5.3.1 does not: `get_master_address`
    disconnects the idle connections only. `stale_released` counts them, for `deposed`."""

    stale_released = 0
    stale_seen = 0

    async def release(self, connection) -> None:
        if connection.is_connected and self.master_address not in (None, (connection.host, connection.port)):
            self.stale_released += 1
            await connection.disconnect()
        await super().release(connection)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        # `get_master_address` disconnects the idle connections only (inuse_connections=False) when the master
        # moved; the client's close (`Redis.aclose`) disconnects them all: only then are the sentinels done with.
        if inuse_connections:
            for client in self.sentinel_manager.sentinels:
                await client.aclose()


async def deposed(redis: Redis) -> bool:
    """Whether `redis` (a client of `master`) may have written to a server that is no longer the master: the
    sentinels name another one than its connections were made to. Asks the sentinels; any other client: False.

    The split brain it catches: a master paused (SIGSTOP, a VM frozen) or cut off long enough for the sentinels
    to promote its replica comes back still a master, and the connections made to it before go on writing
    there, unrefused (no READONLY) until a sentinel demotes it, 8 s at least (sentinel.c
    `sentinelRefreshInstanceInfo`: SENTINEL_PUBLISH_PERIOD*4 of it reporting itself a master); those writes are
    thrown away by its resync. redis-py asks the sentinels only when it connects. So a role that sees its
    master lose its replica (streams.settle's `Replication`) asks here; on True the connections to the old
    address are dropped (`get_master_address` drops the idle ones, `_ClosingPool.release` the others, and here
    a `single_connection_client`'s own, which is never released: the consumers' kind), and the next command
    finds the new master."""
    pool = getattr(redis, "connection_pool", None)  # a cluster client has none
    if not isinstance(pool, _ClosingPool):
        return False
    before = pool.master_address
    await pool.get_master_address()  # Sentinel.discover_master; a new address disconnects the idle connections
    stale, pool.stale_seen = pool.stale_released > pool.stale_seen, pool.stale_released
    held = getattr(redis, "connection", None)  # a single_connection_client's, never released to the pool
    if held is not None and held.is_connected and (held.host, held.port) != pool.master_address:
        await held.disconnect()  # its next command connects again, to the master the sentinels name now
        stale = True
    return pool.master_address != before or stale


def master(url: str, *, connection_class: type, redis_class: type[Redis] = Redis, **kwargs: Any) -> Redis:
    """An async client of the service's master, following failovers. What `Sentinel.master_for` builds, but
    with `connection_class` (a `SentinelManagedConnection` subclass), Redis() arguments kept apart from the
    connection's (`master_for` would hand `single_connection_client` to every connection), and the sentinels'
    clients closed with it."""
    parsed = parse(url)
    client_kwargs = {k: kwargs.pop(k) for k in _CLIENT_ONLY if k in kwargs}
    manager = Sentinel(parsed.sentinels, sentinel_kwargs=parsed.sentinel_kwargs(kwargs))
    pool = _ClosingPool(
        parsed.service,
        manager,
        connection_class=connection_class,
        is_master=True,
        **{**parsed.connection_kwargs(), **kwargs},
    )
    client = redis_class(connection_pool=pool, **client_kwargs)
    client.auto_close_connection_pool = True  # the client owns the pool, as `Redis.from_pool` makes it
    return client


def master_address_sync(url: str, timeout_s: float) -> tuple[str, int]:
    """The master's address as the sentinels name it now (blocking; each sentinel asked at most `timeout_s`);
    redis.sentinel's MasterNotFoundError (a ConnectionError) when none does."""
    parsed = parse(url)
    timeouts = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    manager = sentinel_sync.Sentinel(parsed.sentinels, sentinel_kwargs=parsed.sentinel_kwargs(timeouts))
    try:
        return manager.discover_master(parsed.service)
    finally:
        for client in manager.sentinels:
            client.close()


def master_sync(url: str, **kwargs: Any) -> redis_sync.Redis:
    """A blocking client of the service's master (redis.sentinel, the same rules as the async one)."""
    parsed = parse(url)
    manager = sentinel_sync.Sentinel(parsed.sentinels, sentinel_kwargs=parsed.sentinel_kwargs(kwargs))
    return manager.master_for(parsed.service, **{**parsed.connection_kwargs(), **kwargs})
