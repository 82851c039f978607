"""API keys compared in constant time, /health public under a prefix, CORS origin rules."""

from __future__ import annotations

import hmac

import pytest

from api import auth
from api.cors import allowed_origin, effective_origins
from api.settings import ApiSettings


def settings(*argv: str) -> ApiSettings:
    return ApiSettings.from_args(list(argv), environ={})


def test_every_key_is_compared_with_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    keys = frozenset({"first", "second", "third"})
    assert auth.key_matches("first", keys)
    assert len(compared) == 3  # no early exit on a match
    compared.clear()
    assert not auth.key_matches("fourth", keys)
    assert len(compared) == 3
    assert not auth.key_matches("", keys)
    assert auth.key_matches("ключ", frozenset({"ключ"}))


@pytest.mark.parametrize(("path", "prefix", "public"), [
    ("/health", "", True), ("/v1/health", "", True), ("/llm/health", "/llm", True),
    ("/llm/v1/health", "/llm", True), ("/health", "/llm", True), ("/llm/health", "", False),
    ("/llmx/health", "/llm", False), ("/llm/v1/models", "/llm", False),
])
def test_health_is_public_under_any_prefix(path: str, prefix: str, public: bool) -> None:
    assert auth.is_public(path, prefix) is public


def test_default_echoes_the_origin_with_credentials() -> None:
    assert allowed_origin(settings(), "http://x.test") == "http://x.test"
    assert allowed_origin(settings(), "") is None
    assert allowed_origin(settings("--no-cors-credentials"), "http://x.test") == "*"


def test_a_list_is_matched_per_request() -> None:
    s = settings("--cors-origins", "http://a.test,http://b.test")
    assert allowed_origin(s, "http://b.test") == "http://b.test"
    assert allowed_origin(s, "http://c.test") is None
    assert allowed_origin(s, "") is None


def test_localhost_reflects_local_origins_only() -> None:
    s = settings("--cors-origins", "localhost")
    assert allowed_origin(s, "http://localhost:3000") == "http://localhost:3000"
    assert allowed_origin(s, "http://[::1]:3000") == "http://[::1]:3000"
    assert allowed_origin(s, "http://localhost.evil.test") is None
    assert allowed_origin(s, "file://localhost/x") is None


def test_with_tools_the_default_becomes_localhost() -> None:
    assert effective_origins(settings(), tools_enabled=True) == ["localhost"]
    assert allowed_origin(settings(), "http://evil.test", tools_enabled=True) is None
    explicit = settings("--cors-origins", "*")
    assert effective_origins(explicit, tools_enabled=True) == ["*"]
    assert effective_origins(settings(), tools_enabled=False) == ["*"]
