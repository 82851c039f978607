"""The one place llamaq opens Redis connections (api, worker, scheduler): a plain Redis URL
(`redis://`, `rediss://`, `unix://`) or Redis Sentinel.

Sentinel URL: `redis+sentinel://[[user]:password@]host1:26379,host2:26379/<master name>[/<db>]`
(`rediss+sentinel://` for TLS). The password is the data nodes' (the master's and replicas');
sentinels are asked without one. Neither redis-py's `from_url` nor arq's `from_dsn` read such
a URL, so llamaq builds redis-py's `Sentinel` and arq's `RedisSettings(sentinel=True, …)`
itself. Connections made through Sentinel find the current master each time they connect, so
after a failover every reconnecting client (and the pub/sub listeners, which resubscribe on
reconnect) lands on the new master."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, TypeVar
from urllib.parse import unquote

import redis as sync_redis
import redis.sentinel as sync_sentinel
from arq.connections import ArqRedis, RedisSettings
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import RedisError

from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import InvalidRequest
from scheduler.queueing import deserialize_job, serialize_job
from scheduler.quick_send import quick_send

CONNECT_TIMEOUT_S = 5.0
"""How long a connection to Redis may take to open (a partition: no answer at all)."""
COMMAND_TIMEOUT_S = 5.0
"""How long a reply may take, on every client (a frozen Redis: SIGSTOP, a network partition,
accepts the bytes and never answers): then it is a RedisError (`TimeoutError`) and the
connection is dropped. Pub/sub readers poll instead of blocking (scheduler/pubsub_watch.py),
so an idle subscription is no timeout; no llamaq client blocks longer (BLPOP: 1 s)."""
KEEPALIVE_OPTIONS: dict[int, int] = {
    option: value for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2),
                                      ("TCP_KEEPCNT", 3))
    if (option := getattr(socket, name, None)) is not None
}
"""TCP keepalive: a peer gone from the network is noticed within ~11 s of silence."""
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
AnyRedis = TypeVar("AnyRedis", bound=Redis)


class SentinelTarget(DeferredModel):
    sentinels: list[tuple[str, int]]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False


def parse_sentinel_url(url: str) -> SentinelTarget | None:
    """The Sentinel target a URL names; None for a plain Redis URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SENTINEL_SCHEMES:
        return None
    netloc, _, path = rest.partition("/")
    auth, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = auth.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
    sentinels = []
    for host in filter(None, hosts.split(",")):
        name, colon, port = host.rpartition(":") if ":" in host else (host, "", "")
        try:
            sentinels.append((name or host, int(port) if colon else DEFAULT_SENTINEL_PORT))
        except ValueError:
            raise InvalidRequest(f"bad sentinel address {host!r} in the Redis URL") from None
    parts = [p for p in path.split("/") if p]
    if not sentinels or not parts or len(parts) > 2 or (len(parts) == 2 and
                                                        not parts[1].isdigit()):
        raise InvalidRequest("a Sentinel URL reads redis+sentinel://host:port[,host:port…]"
                             "/<master name>[/<db>]")
    return SentinelTarget(sentinels=sentinels, master=parts[0],
                          db=int(parts[1]) if len(parts) == 2 else 0, username=username,
                          password=password, ssl=scheme.startswith("rediss"))


CONNECTION_OPTIONS: dict[str, Any] = {
    "socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": COMMAND_TIMEOUT_S,
    "socket_keepalive": True, "socket_keepalive_options": KEEPALIVE_OPTIONS}
"""Every connection's: a connect timeout, a reply timeout and TCP keepalive."""


def open_redis(url: str) -> Redis:
    """A redis-py client for the URL (through Sentinel when it names sentinels) with
    CONNECTION_OPTIONS."""
    return _client(url, Redis)


def open_sync_redis(url: str) -> sync_redis.Redis:
    """A blocking redis-py client for the URL, for a thread that must not wait on an event
    loop (worker/process/lease_keeper.py), with CONNECTION_OPTIONS."""
    target = parse_sentinel_url(url)
    if target is None:
        return sync_redis.Redis.from_url(url, **CONNECTION_OPTIONS)
    sentinel = sync_sentinel.Sentinel(
        target.sentinels, ssl=target.ssl,
        sentinel_kwargs={"ssl": target.ssl, "socket_connect_timeout": CONNECT_TIMEOUT_S,
                         "socket_timeout": CONNECT_TIMEOUT_S})
    client: sync_redis.Redis = sentinel.master_for(
        target.master, db=target.db, username=target.username, password=target.password,
        **CONNECTION_OPTIONS)
    return client


def _client(url: str, redis_class: type[AnyRedis]) -> AnyRedis:
    target = parse_sentinel_url(url)
    if target is None:
        plain = redis_class.from_url(url, **CONNECTION_OPTIONS)
        quick_send(plain)
        return plain
    sentinel = Sentinel(target.sentinels, ssl=target.ssl,
                        sentinel_kwargs={"ssl": target.ssl,
                                         "socket_connect_timeout": CONNECT_TIMEOUT_S,
                                         "socket_timeout": CONNECT_TIMEOUT_S})
    client: AnyRedis = sentinel.master_for(
        target.master, redis_class=redis_class, db=target.db, username=target.username,
        password=target.password, **CONNECTION_OPTIONS)
    quick_send(client)
    return client


async def open_arq(url: str) -> ArqRedis:
    """arq's client for the URL (jobs as JSON) with CONNECTION_OPTIONS: arq's own create_pool
    sets no reply timeout and no keepalive, so a partition would hang its calls for good.
    Waits for Redis to answer, as create_pool does (arq_settings' retries)."""
    settings = arq_settings(url)
    pool = _client(url, ArqRedis)
    pool.job_serializer, pool.job_deserializer = serialize_job, deserialize_job
    for retries_left in range(settings.conn_retries, -1, -1):
        try:
            await pool.ping()
            return pool
        except (RedisError, OSError):
            if not retries_left:
                await pool.aclose()
                raise
            await asyncio.sleep(settings.conn_retry_delay)
    raise AssertionError("unreachable")


def arq_settings(url: str) -> RedisSettings:
    """arq's settings for the URL (sentinel=True with the sentinels as hosts)."""
    target = parse_sentinel_url(url)
    if target is None:
        return RedisSettings.from_dsn(url)
    return RedisSettings(host=target.sentinels, sentinel=True, sentinel_master=target.master,
                         database=target.db, username=target.username,
                         password=target.password, ssl=target.ssl,
                         conn_retries=30, conn_retry_delay=1)
