"""The one way roles open a Redis client: bytes in and out, commands packed by hiredis.

redis-py's asyncio connection packs every command argument in Python (its sync twin already uses
`hiredis.pack_command`); on the wire benchmark that packing was 64% of the runtime's time. Packing in C
is the same RESP bytes, so the subclass below changes speed only.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from streams.cluster import connect_cluster, is_cluster_url


class HiredisPackedConnection(Connection):
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


def connect(url: str, **kwargs) -> Redis:
    """Async client for `url`, with the hiredis packer and bytes responses (the codec decodes).

    `redis+cluster://host:port[,host:port...]` gives a Redis Cluster client (streams/cluster.py)."""
    if is_cluster_url(url):
        return connect_cluster(url, HiredisPackedConnection, **kwargs)
    return Redis.from_url(url, connection_class=HiredisPackedConnection, **kwargs)


def shown_url(url: str) -> str:
    """The URL without its password, for messages and reports (a cluster URL's list of nodes included)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")).geturl()
