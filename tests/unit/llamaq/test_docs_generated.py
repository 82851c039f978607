"""The tables of docs/ that are generated from the code (llamaq/docs.py) match it: run
`python -m llamaq.docs` after changing a Redis key, a flag or a role's settings."""

from __future__ import annotations

from llamaq import docs


def test_every_redis_key_has_a_lifetime() -> None:
    missing = sorted(set(docs.key_names()) - set(docs.LIFETIMES))
    assert not missing, f"keys without a row in llamaq/docs.py: {missing}"
    assert not set(docs.LIFETIMES) - set(docs.key_names()), "rows of keys that are gone"


def test_the_committed_tables_are_the_codes() -> None:
    assert docs.stale() == [], "run `python -m llamaq.docs` and commit docs/"
