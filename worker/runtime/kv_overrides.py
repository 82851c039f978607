"""--override-kv KEY=TYPE:VALUE,... (llama.cpp's common `string_parse_kv_override`): model
metadata overrides, handed to llama_model_params.kv_overrides (the NULL-key-terminated array
llama-cpp-python's `Llama(kv_overrides=)` builds too) so every key the model loader reads --
`tokenizer.ggml.add_bos_token`, a wrong context length, an architecture's hyperparameter --
takes the given value instead of the file's."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the settings parse the flag before llama_cpp may be imported
    import ctypes

    import llama_cpp as lc

KEY_MAX = 128
"""Bytes of a key, its NUL included (llama_model_kv_override.key)."""
STR_MAX = 127
"""Bytes of a str value, without its NUL."""


@dataclass(frozen=True)
class KvOverride:
    key: str
    value: int | float | bool | str


def parse_item(item: str) -> KvOverride:
    """One KEY=TYPE:VALUE; ValueError with llama.cpp's words when it is not one."""
    key, sep, typed = item.partition("=")
    if not sep or len(key.encode()) >= KEY_MAX:
        raise ValueError(f"malformed KV override '{item}'")
    kind, colon, raw = typed.partition(":")
    if not colon or kind not in ("int", "float", "bool", "str"):
        raise ValueError(f"invalid type for KV override '{item}'")
    if kind == "int":
        return KvOverride(key, _leading_number(raw, int))
    if kind == "float":
        return KvOverride(key, _leading_number(raw, float))
    if kind == "bool":
        if raw not in ("true", "false"):
            raise ValueError(f"invalid boolean value for KV override '{item}'")
        return KvOverride(key, raw == "true")
    if len(raw.encode()) > STR_MAX:
        raise ValueError(f"malformed KV override '{item}', value cannot exceed 127 chars")
    return KvOverride(key, raw)


def _leading_number(raw: str, kind: type[int] | type[float]) -> int | float:
    """atol / atof: the longest leading number, 0 when there is none."""
    text = raw.strip()
    for end in range(len(text), 0, -1):
        try:
            return kind(text[:end])
        except ValueError:
            continue
    return kind(0)


def parse_kv_overrides(values: list[str]) -> list[KvOverride]:
    """Every occurrence of the flag, each a CSV row of items (llama.cpp's parse_csv_row)."""
    return [parse_item(item) for value in values
            for row in csv.reader([value]) for item in row]


def kv_override_array(overrides: list[KvOverride]) -> ctypes.Array[lc.llama_model_kv_override]:
    """The C array, its last element's key empty (llama.cpp's end mark)."""
    import llama_cpp as lc
    array = (lc.llama_model_kv_override * (len(overrides) + 1))()
    for slot, override in zip(array, overrides, strict=False):
        slot.key = override.key.encode()
        value = override.value
        if isinstance(value, bool):
            slot.tag = lc.LLAMA_KV_OVERRIDE_TYPE_BOOL
            slot.value.val_bool = value
        elif isinstance(value, int):
            slot.tag = lc.LLAMA_KV_OVERRIDE_TYPE_INT
            slot.value.val_i64 = value
        elif isinstance(value, float):
            slot.tag = lc.LLAMA_KV_OVERRIDE_TYPE_FLOAT
            slot.value.val_f64 = value
        else:
            slot.tag = lc.LLAMA_KV_OVERRIDE_TYPE_STR
            slot.value.val_str = value.encode()
    return array


def apply_kv_overrides(params: lc.llama_model_params, overrides: list[KvOverride]) -> None:
    """Point `params` at the overrides (ctypes keeps the array alive with `params`)."""
    if overrides:
        params.kv_overrides = kv_override_array(overrides)  # kept in params._objects
