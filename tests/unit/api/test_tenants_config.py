"""The --tenants file (api/tenants/config.py) and the key directory (api/tenants/service.py):
what a file may say, what it may not, and what a reload that fails keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.tenants.config import DEFAULT_TENANT, parse_tenants, read_tenants
from api.tenants.service import TenantDirectory


def write(path: Path, tenants: list[dict[str, object]]) -> str:
    path.write_text(json.dumps({"tenants": tenants}))
    return str(path)


def test_a_file_gives_names_keys_and_limits(tmp_path: Path) -> None:
    found = read_tenants(write(tmp_path / "t.json", [
        {"name": "alice", "keys": ["ka"], "max_concurrent": 2, "tokens_per_minute": 100,
         "requests_per_minute": 5, "priority": "batch", "max_file_bytes": 10,
         "max_stored_bytes": 20},
        {"name": "ops", "keys": ["ko"], "admin": True}]))
    alice, ops = found.tenants
    assert (alice.max_concurrent, alice.tokens_per_minute, alice.requests_per_minute,
            alice.priority, alice.max_file_bytes, alice.max_stored_bytes) == (
        2, 100, 5, "batch", 10, 20)
    assert ops.admin and ops.max_concurrent is None and ops.priority == "interactive"


@pytest.mark.parametrize(("tenants", "words"), [
    ([{"name": DEFAULT_TENANT, "keys": ["k"]}], "--api-key"),
    ([{"name": "a", "keys": ["k"]}, {"name": "b", "keys": ["k"]}], "two tenants"),
    ([{"name": "a", "keys": ["k"]}, {"name": "a", "keys": ["j"]}], "one name"),
    ([{"name": "a", "keys": []}], "keys"),
    ([{"name": "a", "keys": ["k"], "max_concurrent": 0}], "max_concurrent"),
    ([{"name": "a", "keys": ["k"], "priority": "urgent"}], "priority"),
    ([{"name": "a", "keys": ["k"], "burst": 3}], "burst"),
    ([{"name": "a/b", "keys": ["k"]}], "name"),
    ([{"name": "a", "keys": [" k"]}], "spaces"),
])
def test_a_bad_file_is_refused_by_name(tenants: list[dict[str, object]], words: str) -> None:
    with pytest.raises(ValueError, match="--tenants") as caught:
        parse_tenants(json.dumps({"tenants": tenants}).encode(), "t.json")
    assert words in str(caught.value)


def test_not_json_and_missing_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not JSON"):
        parse_tenants(b"{", "t.json")
    with pytest.raises(ValueError, match="cannot be read"):
        read_tenants(str(tmp_path / "nothing.json"))


def test_keys_find_their_tenant_and_api_keys_are_the_default(tmp_path: Path) -> None:
    url = write(tmp_path / "t.json", [{"name": "alice", "keys": ["ka", "ka2"]}])
    directory = TenantDirectory(frozenset({"kd"}), url)
    assert directory.auth_on and directory.enabled
    assert directory.by_key("ka").name == "alice"  # type: ignore[union-attr]
    assert directory.by_key("ka2").name == "alice"  # type: ignore[union-attr]
    assert directory.by_key("kd").name == DEFAULT_TENANT  # type: ignore[union-attr]
    assert directory.by_key("k") is None
    assert directory.by_key("") is None


def test_without_keys_everyone_is_the_default_tenant() -> None:
    directory = TenantDirectory(frozenset())
    assert not directory.auth_on and not directory.enabled
    assert directory.by_key("").name == DEFAULT_TENANT  # type: ignore[union-attr]


def test_a_key_of_api_key_and_of_a_tenant_is_refused(tmp_path: Path) -> None:
    url = write(tmp_path / "t.json", [{"name": "alice", "keys": ["k"]}])
    with pytest.raises(ValueError, match="--api-key"):
        TenantDirectory(frozenset({"k"}), url)


def test_reload_takes_a_new_file_and_keeps_the_old_one_when_bad(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    url = write(path, [{"name": "alice", "keys": ["ka"]}])
    directory = TenantDirectory(frozenset(), url)
    write(path, [{"name": "alice", "keys": ["ka"]}, {"name": "bob", "keys": ["kb"]}])
    assert directory.reload()
    assert directory.by_key("kb").name == "bob"  # type: ignore[union-attr]
    path.write_text("{not json")
    assert not directory.reload()
    assert directory.by_key("kb").name == "bob"  # type: ignore[union-attr]
    write(path, [{"name": "alice", "keys": ["ka"]}])
    assert directory.reload()
    assert directory.by_key("kb") is None
    assert directory.by_name("bob").max_concurrent is None  # a gone owner: no limits


def test_cache_salts_are_groups_named_whole(tmp_path: Path) -> None:
    """Each tenant's caches are its own (its name is its salt) unless its cache group names
    it: the tenants that name each other share one salt; without --tenants, no salt."""
    url = write(tmp_path / "t.json", [
        {"name": "alice", "keys": ["ka"]},
        {"name": "bob", "keys": ["kb"], "share_cache_with": ["carol", "dave"]},
        {"name": "carol", "keys": ["kc"], "share_cache_with": ["bob", "dave"]},
        {"name": "dave", "keys": ["kd"], "share_cache_with": ["carol", "bob"]}])
    directory = TenantDirectory(frozenset({"k0"}), url)
    assert directory.cache_salt("alice") == "alice"
    assert directory.cache_salt(DEFAULT_TENANT) == DEFAULT_TENANT
    assert {directory.cache_salt(n) for n in ("bob", "carol", "dave")} == {"bob+carol+dave"}
    assert TenantDirectory(frozenset({"k0"})).cache_salt(DEFAULT_TENANT) is None


@pytest.mark.parametrize(("sharing", "words"), [
    ({"a": ["b"]}, "named whole"),  # b does not name a
    ({"a": ["b"], "b": ["a", "c"], "c": ["b"]}, "named whole"),  # a would meet c through b
    ({"a": ["a"]}, "itself"),
    ({"a": ["zed"]}, "no tenant"),
])
def test_a_cache_group_not_named_whole_is_refused(sharing: dict[str, list[str]],
                                                  words: str) -> None:
    tenants = [{"name": n, "keys": [f"k{n}"], "share_cache_with": sharing.get(n, [])}
               for n in "abc"]
    with pytest.raises(ValueError, match="--tenants") as caught:
        parse_tenants(json.dumps({"tenants": tenants}).encode(), "t.json")
    assert words in str(caught.value)
