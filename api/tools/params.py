"""Reading a tool's parameters as llama-server reads them: `required` is nlohmann's `at()`
(missing or of the wrong type: a 400), `optional` is its `json_value()` (missing, null or of
the wrong type: the default)."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from api.tools.errors import missing_key, wrong_type

T = TypeVar("T", str, int, bool)

_NAMES = {str: "string", int: "number", bool: "boolean"}


def _convert(value: Any, kind: type[T]) -> T | None:
    """`value` as `kind` the way nlohmann's get<T>() converts it (None: it does not)."""
    converted: Any = None
    if kind is str or kind is bool:
        converted = value if type(value) is kind else None
    elif isinstance(value, (bool, int, float)):  # a boolean reads as the number 0 or 1
        converted = int(value)
    return cast(T | None, converted)


def required(params: dict[str, Any], key: str, kind: type[T]) -> T:
    if key not in params:
        raise missing_key(key)
    converted = _convert(params[key], kind)
    if converted is None:
        raise wrong_type(_NAMES[kind], params[key])
    return converted


def optional(params: dict[str, Any], key: str, default: T) -> T:
    value = params.get(key)
    if value is None:
        return default
    converted = _convert(value, type(default))
    return default if converted is None else converted
