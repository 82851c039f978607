"""Redis URLs: plain ones go to redis-py/arq as they are; Sentinel URLs are parsed by llamaq."""

from __future__ import annotations

import pytest

from scheduler.connections import arq_settings, parse_sentinel_url
from scheduler.contract.errors import InvalidRequest


def test_plain_urls_are_not_sentinel() -> None:
    assert parse_sentinel_url("redis://127.0.0.1:6379/0") is None
    assert arq_settings("redis://127.0.0.1:6380/2").port == 6380


def test_sentinel_url() -> None:
    target = parse_sentinel_url("redis+sentinel://:s3cret@h1:26379,h2:26380,h3/mymaster/2")
    assert target is not None
    assert target.sentinels == [("h1", 26379), ("h2", 26380), ("h3", 26379)]
    assert (target.master, target.db, target.password) == ("mymaster", 2, "s3cret")
    settings = arq_settings("redis+sentinel://h1:26379,h2:26379/mymaster")
    assert settings.sentinel and settings.sentinel_master == "mymaster"
    assert settings.host == [("h1", 26379), ("h2", 26379)] and settings.database == 0


@pytest.mark.parametrize("url", ["redis+sentinel://h1:26379", "redis+sentinel:///m",
                                 "redis+sentinel://h1:x/m", "redis+sentinel://h1/m/db"])
def test_bad_sentinel_urls(url: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_sentinel_url(url)
