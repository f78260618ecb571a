"""Redis Cluster: `redis+cluster://[user:password@]host1:port1[,host2:port2...][?option=value...]`.

A run lives on one hash slot (every key is `{ps:<run>}:...`, streams/keys.py), so on a cluster each run is
served by one master and several runs spread over the masters. The roles talk to the cluster through
redis-py 5.3.1's `redis.asyncio.cluster.RedisCluster`, which routes each command by its key's slot and
follows MOVED/ASK itself; what it does not do is handled here:

- The hiredis packer (streams/connect.py). `RedisCluster.__init__` hard-codes `connection_class=Connection`
  in the connection kwargs it shares with its `NodesManager` (redis/asyncio/cluster.py), and every node it
  discovers is a `ClusterNode(..., **connection_kwargs)` whose `acquire_connection` builds
  `connection_class(**connection_kwargs)`: setting the class in that dict (and on the seed nodes, built
  already) gives every connection the C packer. Same RESP bytes; speed only.
- Transactions. redis-py's `ClusterPipeline` refuses `transaction=True` ("transaction is deprecated in
  cluster mode", `RedisCluster.pipeline`) and splits a pipeline per node, re-sending failed commands one by
  one. A run's MULTI is on one slot, so it can run as is on the master that holds the slot: `transaction()`
  returns the pipeline of a plain client to that master. Redis refuses a queued command whose slot the node
  does not serve (MOVED) or a transaction spanning two slots (CROSSSLOT), and then discards the whole
  transaction at EXEC (EXECABORT), so a moved slot can never half-apply a transaction: `transaction()`
  raises `SlotMoved`, a ConnectionError, which the roles' ride-out treats like an outage (retry from the
  state in Redis), after refreshing the client's slot table. `slot_pipeline()` is the same without the
  MULTI: one connection to the slot's master, for a write followed by WAIT (streams/settle.py).
- Outages. A cluster that cannot serve a slot answers CLUSTERDOWN, MASTERDOWN or TRYAGAIN; redis-py
  retries those a few times (`cluster_error_retry_attempts`) and then raises them as ResponseErrors, which
  no ride-out waits out. `ClusterClient` raises them as `ClusterUnavailable`, a ConnectionError.
- Pipelines. `ClusterPipeline` has no `pipeline_execute_command` (streams/publisher.py stages its XADDs
  with it) and looks a command up by its name as a str; `pipeline()` returns one that has it.
- Seeds. The client drops a node that refused a connection from its startup nodes (`_execute_command`),
  and once it has dropped every one it can never find the cluster again; and when no seed answers,
  `NodesManager.initialize` raises a bare `RedisClusterException`, which no ride-out recognizes as an
  outage. `ClusterClient` puts the URL's seeds back and raises that case as a `ConnectionError`, so a role
  rides out a cluster that is restarting as it rides out a single Redis that is.
- Server commands (INFO, CONFIG): redis-py sends them to a "default node", any master; `node_of()` names
  the master of the run's slot, for `target_nodes=`.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis
import redis.cluster
from redis import exceptions as rx
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import ConnectionPool, parse_url

SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# Connection kwargs of the cluster client that a plain client to one of its masters shares (the rest are the
# cluster's own: parser, callbacks, max_connections, and its retry policy: the plain client retries as
# `connect()`'s single-Redis client does).
_SHARED = (
    "username",
    "password",
    "credential_provider",
    "client_name",
    "socket_connect_timeout",
    "socket_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "health_check_interval",
    "ssl_ca_certs",
    "ssl_ca_data",
    "ssl_cert_reqs",
    "ssl_certfile",
    "ssl_check_hostname",
    "ssl_keyfile",
    "ssl_min_version",
    "ssl_ciphers",
)


class SlotMoved(rx.ConnectionError):
    """The run's slot moved to another master during a transaction; Redis discarded all of it."""


class ClusterUnavailable(rx.ConnectionError):
    """The cluster cannot serve the slot now: CLUSTERDOWN (a master is failing, or not all slots are served),
    MASTERDOWN, TRYAGAIN (a slot being migrated), or the slot is in no node's hands, past redis-py's own
    retries (`cluster_error_retry_attempts`, 0.25 s apart). An outage like a restarting server, so a
    ConnectionError: what the roles ride out (streams.ride_out, streams.runtime)."""


# What a cluster answers while it cannot serve a slot (redis/exceptions.py; MasterDownError is a
# ClusterDownError), and the "not covered" a client sees while its slot table is being rebuilt.
_OUTAGE = (rx.ClusterDownError, rx.TryAgainError, rx.SlotNotCoveredError)
_OUTAGE_REPLIES = ("CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN")


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in SCHEMES


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], dict]:
    """The seed nodes and the connection options of a `redis+cluster://` URL.

    The options (credentials, `?socket_timeout=...`) are parsed by redis-py's own `parse_url`, on the URL of
    the first seed; a database number is refused (a cluster has database 0 only)."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"not a cluster URL (redis+cluster://host:port[,host:port...]): {url!r}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    seeds = []
    for hostport in filter(None, hosts.split(",")):
        host, sep, port = hostport.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"cluster URL: {hostport!r} is not host:port")
        seeds.append((host.strip("[]"), int(port)))
    if not seeds:
        raise ValueError("cluster URL names no node: redis+cluster://host:port[,host:port...]")
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"cluster URL: a cluster has database 0 only, not {parts.path.strip('/')!r}")
    first = f"{userinfo}@{hosts.split(',')[0]}" if userinfo else hosts.split(",")[0]
    options = parse_url(urlunsplit((SCHEMES[parts.scheme], first, "", parts.query, "")))
    for name in ("host", "port", "db"):
        options.pop(name, None)
    if options.pop("connection_class", None) is not None:  # rediss: redis-py's own class, by its flag
        options["ssl"] = True
    return seeds, options


class ClusterClient(RedisCluster):
    """`RedisCluster` with the hiredis packer, its seeds kept, and plain clients to its masters for
    transactions (module docstring)."""

    def __init__(self, seeds: list[tuple[str, int]], connection_class: type | None, **kwargs) -> None:
        super().__init__(startup_nodes=[ClusterNode(h, p) for h, p in seeds], **kwargs)
        if connection_class is not None:  # None: TLS, redis-py's SSLConnection (set by `ssl=True`)
            self.connection_kwargs["connection_class"] = connection_class
            for node in self.nodes_manager.startup_nodes.values():
                node.connection_class = connection_class
        self._seeds = seeds
        self._masters: dict[str, Redis] = {}  # node name -> plain client, for transactions

    async def initialize(self) -> RedisCluster:
        manager = self.nodes_manager
        for host, port in self._seeds:  # dropped by `_execute_command` after a refused connection
            name = redis.cluster.get_node_name(host, port)
            if name not in manager.startup_nodes:
                manager.startup_nodes[name] = ClusterNode(host, port, **self.connection_kwargs)
        try:
            return await super().initialize()
        except rx.RedisClusterException as e:
            # NodesManager.initialize: "Redis Cluster cannot be connected", raised from the last node's error.
            if isinstance(e.__cause__, (rx.ConnectionError, rx.TimeoutError, OSError)):
                raise rx.ConnectionError(f"no node of the cluster answers: {e.__cause__}") from e
            raise

    async def execute_command(self, *args, **kwargs):
        try:
            return await super().execute_command(*args, **kwargs)
        except _OUTAGE as e:
            raise ClusterUnavailable(str(e)) from e

    def pipeline(self, transaction: bool | None = None, shard_hint=None) -> ClusterPipeline:
        """redis-py's non-transactional cluster pipeline (commands grouped per node). A MULTI goes through
        `transaction()`, on the master of one slot."""
        if transaction or shard_hint:
            raise rx.RedisClusterException("a transaction on a cluster: use streams.cluster.transaction(redis, key)")
        return _ClusterPipeline(self)

    async def node_of(self, key: str) -> ClusterNode:
        """The master serving `key`'s slot."""
        if self._initialize:
            await self.initialize()
        return self.get_node_from_key(key)

    async def master_client(self, key: str) -> Redis:
        """A plain client to the master serving `key`'s slot (one per master, kept)."""
        node = await self.node_of(key)
        client = self._masters.get(node.name)
        if client is None:
            kwargs = self.connection_kwargs
            shared = {k: kwargs[k] for k in _SHARED if kwargs.get(k) is not None}
            # The cluster's own class: the hiredis packer, or SSLConnection (with the ssl_* options above).
            pool = ConnectionPool(host=node.host, port=node.port, connection_class=kwargs["connection_class"], **shared)
            client = self._masters[node.name] = Redis(connection_pool=pool)
        return client

    async def aclose(self) -> None:
        await super().aclose()
        for client in self._masters.values():
            await client.connection_pool.disconnect()  # the pool reconnects on its next use

    close = aclose


class _ClusterPipeline(ClusterPipeline):
    # `Pipeline.pipeline_execute_command` stages a command without redis-py's per-command checks
    # (streams/publisher.py); on a cluster pipeline, `execute_command` only stages it too. The command name
    # as a str: the cluster client looks its flags and keys up by name (`_determine_slot`).
    def pipeline_execute_command(self, name: str | bytes, *args, **kwargs) -> ClusterPipeline:
        return self.execute_command(name.decode() if isinstance(name, bytes) else name, *args, **kwargs)

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list:
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except _OUTAGE as e:
            raise ClusterUnavailable(str(e)) from e


def connect_cluster(url: str, connection_class: type, **kwargs) -> ClusterClient:
    """Async cluster client for a `redis+cluster://` URL; `kwargs` as for `redis.asyncio.Redis`.

    `single_connection_client` is dropped: a cluster client keeps a pool per node and hands a task's one
    command at a time the same free connection, without the plain pool's probe for stray data before each
    command (`ClusterNode.acquire_connection`), which is what the flag buys on a single Redis."""
    kwargs.pop("single_connection_client", None)
    seeds, options = parse_cluster_url(url)
    if options.get("ssl"):
        connection_class = None  # redis-py picks its SSLConnection; the packer is for plain TCP only
    return ClusterClient(seeds, connection_class, **{**options, **kwargs})


async def on_slot(client: Redis | ClusterClient, key: str) -> dict:
    """`target_nodes=` for a server command (TIME, INFO, PING) meant for the server holding `key`: on a
    cluster redis-py sends those to a "default node", any master (COMMAND_FLAGS, redis/cluster.py), whose
    clock or figures are not the run's. `{}` on a single Redis."""
    if isinstance(client, ClusterClient):
        return {"target_nodes": await client.node_of(key)}
    return {}


def connect_cluster_sync(url: str, **kwargs) -> redis.cluster.RedisCluster:
    """A synchronous cluster client for a `redis+cluster://` URL (`kwargs` as for `redis.Redis`); use
    streams.connect.connect_sync, which takes every kind of URL."""
    seeds, options = parse_cluster_url(url)
    nodes = [redis.cluster.ClusterNode(h, p) for h, p in seeds]
    return redis.cluster.RedisCluster(startup_nodes=nodes, **{**options, **kwargs})


def transaction(client: Redis | ClusterClient, key: str):
    """An async context manager giving a MULTI/EXEC pipeline for commands on `key`'s slot, on a single Redis
    or a cluster:

        async with transaction(redis, keys.trainer_state) as pipe:
            pipe.hset(...); await pipe.execute()

    On a cluster it runs on the master of the slot; a slot that moved meanwhile raises `SlotMoved` and
    applies nothing (module docstring)."""
    if isinstance(client, ClusterClient):
        return _SlotPipeline(client, key, transaction=True)
    return client.pipeline(transaction=True)


def slot_pipeline(client: Redis | ClusterClient, key: str):
    """As `transaction()`, without the MULTI: a pipeline whose commands all go down one connection to the
    server of `key`'s slot, as WAIT needs (it counts the replicas that have this connection's writes;
    streams/settle.py). A command refused with MOVED raises `SlotMoved` after the slot table is read again;
    the commands before it were applied, so what goes down it must be safe to send again."""
    if isinstance(client, ClusterClient):
        return _SlotPipeline(client, key, transaction=False)
    return client.pipeline(transaction=False)


class _SlotPipeline:
    def __init__(self, client: ClusterClient, key: str, transaction: bool) -> None:
        self.client, self.key, self.transaction = client, key, transaction

    async def __aenter__(self):
        node = await self.client.node_of(self.key)
        master = await self.client.master_client(self.key)
        self._pipe = master.pipeline(transaction=self.transaction)
        await self._pipe.__aenter__()
        execute = self._pipe.execute

        async def checked_execute(raise_on_error: bool = True):
            try:
                results = await execute(raise_on_error)
            except (rx.ConnectionError, rx.TimeoutError):
                # The master is gone: read the slot table again on the next command, as redis-py does after
                # a node's connection error (`RedisCluster._execute_command`), to find a replica promoted.
                await self.client.aclose()
                raise
            except rx.ResponseError as e:
                # A plain client parses MOVED/ASK as a ResponseError; in a transaction EXECABORT follows:
                # nothing applied.
                await self._refused(e, node)
            # Without raise_on_error (a slot pipeline's EVALSHA + WAIT), a refusal is among the results.
            for result in results:
                if isinstance(result, rx.ResponseError):
                    await self._refused(result, node, raise_other=False)
            return results

        self._pipe.execute = checked_execute
        return self._pipe

    async def _refused(self, e: rx.ResponseError, node: ClusterNode, raise_other: bool = True) -> None:
        text = str(e)
        if any(reply in text for reply in _OUTAGE_REPLIES):
            raise ClusterUnavailable(text) from e
        if "MOVED" not in text and "ASK " not in text:
            if raise_other:
                raise e
            return
        await self.client.nodes_manager.initialize()  # the new slot table, for the retry
        what = "a transaction" if self.transaction else "a pipeline"
        if self.client.get_node_from_key(self.key) == node:
            # The slot did not move: a command of the pipeline is off the slot, a bug to fix.
            raise rx.ResponseError(f"{what} on {self.key}'s slot holds a key of another: {text}") from e
        applied = "nothing applied" if self.transaction else "the commands before it applied"
        raise SlotMoved(f"{self.key}'s slot moved during {what} ({applied}): {text}") from e

    async def __aexit__(self, *exc) -> None:
        await self._pipe.__aexit__(*exc)


def slot_master_url(url: str, key: str) -> str:
    """`redis://[user:password@]host:port` of the master serving `key`'s slot now, asked synchronously (for
    settings built at import, like arq's)."""
    seeds, options = parse_cluster_url(url)
    sync_options = {k: v for k, v in options.items() if k in _SHARED or k == "ssl"}
    client = redis.cluster.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in seeds], **sync_options
    )
    try:
        node = client.get_node_from_key(key)
        host, port = node.host, node.port
    finally:
        client.close()
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    scheme = SCHEMES[parts.scheme]
    return urlunsplit((scheme, f"{userinfo}{at}{host}:{port}", "", parts.query, ""))
