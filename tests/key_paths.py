"""The shape of a JSON answer as key paths and value types, to compare llamaq's answers with
llama-server's (tests/data/llama_server_keys.json, recorded by
bench/record_llama_server_keys.py)."""

from __future__ import annotations

from typing import Any


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"  # C++ writes 1.0 as 1.0, but an unset float may come out as 0
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def key_paths(value: Any, prefix: str = "") -> dict[str, str]:
    """Each key path (`a.b`, `a[].b` for the items of an array) and its value's type; an
    object's keys that are data, not fields (none here), would need a placeholder."""
    paths: dict[str, str] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths[path] = type_name(item)
            paths.update(key_paths(item, path))
    elif isinstance(value, list):
        for item in value:
            paths.update(key_paths(item, f"{prefix}[]"))
    return paths
