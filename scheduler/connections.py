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

from urllib.parse import unquote

from arq.connections import RedisSettings
from pydantic import BaseModel
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

from scheduler.contract.errors import InvalidRequest

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379


class SentinelTarget(BaseModel):
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


def open_redis(url: str) -> Redis:
    """A redis-py client for the URL (through Sentinel when it names sentinels)."""
    target = parse_sentinel_url(url)
    if target is None:
        return Redis.from_url(url)
    sentinel = Sentinel(target.sentinels, ssl=target.ssl,
                        sentinel_kwargs={"ssl": target.ssl})
    return sentinel.master_for(target.master, db=target.db, username=target.username,
                               password=target.password)


def arq_settings(url: str) -> RedisSettings:
    """arq's settings for the URL (sentinel=True with the sentinels as hosts)."""
    target = parse_sentinel_url(url)
    if target is None:
        return RedisSettings.from_dsn(url)
    return RedisSettings(host=target.sentinels, sentinel=True, sentinel_master=target.master,
                         database=target.db, username=target.username,
                         password=target.password, ssl=target.ssl,
                         conn_retries=30, conn_retry_delay=1)
