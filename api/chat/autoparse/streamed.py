"""A call block the auto-parser reads (syntax.py), read while it is still open, so that its
calls stream as llama-server streams them (each call's id and name once they are known, then
its arguments in pieces): what llama.cpp's PEG mapper (common/chat-peg-parser.cpp) has of the
calls at each partial parse. The reader gives, for each call begun so far, (name, the
arguments certain so far, the arguments guessed whole, the call's id where the format writes
one), up to the first whose name (and id) are not complete; the certain arguments are always a
prefix of what the whole block's reader gives (compact JSON), so the pieces add up to the
whole answer's arguments.

- Tagged name, JSON arguments (TAG_WITH_JSON): the name once what follows it shows it is
  whole, the id once its closing marker is written, then the JSON arguments as far as they can
  be closed (api/chat/partial_calls.py).
- Tagged name, tagged arguments (TAG_WITH_TAGGED): the name once the first argument's tag (or
  the call's close) follows it; each argument once its value closes, a string one (as the
  schema types it) as its text is written, less what may still be markup (a piece of the
  value's closing tag, the newline before it) — llama.cpp streams string values so.
- JSON objects (JSON_NATIVE) of `name`/`arguments`: the generic JSON call's reader."""

from __future__ import annotations

import json
from collections.abc import Callable

from api.chat.autoparse.diff import WHITESPACE, trim
from api.chat.autoparse.syntax import _after, _call_id, _has_call_id, call_name
from api.chat.autoparse.tool_analysis import ToolAnalysis
from api.chat.partial_calls import partial_arguments, partial_call
from api.chat.tagged_calls import ParamTypes, typed_value
from api.chat.tool_formats import dump_arguments, partial_suffix

Partial = tuple[str, str, str, "str | None"]
CallsReader = Callable[[str, ParamTypes], "list[Partial]"]


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _waiting(text: str, markers: tuple[str, ...]) -> bool:
    """Whether `text` (leading whitespace aside) may still become one of `markers`."""
    rest = text.lstrip(WHITESPACE)
    return any(m.startswith(rest) and len(rest) < len(m) for m in markers if m)


def _string_value(t: ToolAnalysis, raw: str, closers: tuple[str, ...]) -> str | None:
    """The certain text of a string value being written (`raw`: from its opening tag on), or
    None while nothing of it is certain."""
    raw = raw[:len(raw) - partial_suffix(raw, 0, closers)]
    if not raw:
        return None
    if trim(t.arg_name_suffix) and t.arg_name_suffix.endswith("\n") and raw.startswith("\n"):
        raw = raw[1:]  # the newline after the key's tag is markup (syntax.py)
    if not raw:
        return None
    if raw.startswith("\n"):  # `\nVALUE\n`: one newline each side is markup (unwrap_value)
        raw = raw[1:].removesuffix("\n")
    return raw


def _tagged_arguments(t: ToolAnalysis, body: str, known: dict[str, object]) -> tuple[str, str]:
    """(certain, guessed) arguments of tagged `KEY`/`VALUE` pairs still being written."""
    name_prefix, name_suffix = trim(t.arg_name_prefix), trim(t.arg_name_suffix)
    value_prefix = trim(t.arg_value_prefix)
    value_suffix = t.arg_value_suffix.rstrip(WHITESPACE)
    closers = (value_suffix, value_suffix.lstrip(WHITESPACE))
    arguments: dict[str, object] = {}
    open_value = ""
    rest = body
    while (after := _after(rest, name_prefix)) is not None:
        key, sep, value = after.partition(name_suffix)
        if not sep:
            break
        key = key.strip(WHITESPACE)
        if value_prefix:
            if _waiting(value, (value_prefix,)):
                break
            value = after_prefix if (after_prefix := _after(value, value_prefix)) is not None \
                else value
        end, closer = value.find(closers[0]), closers[0]
        if end < 0:
            end, closer = value.find(closers[1]), closers[1]
        if end < 0:
            text = _string_value(t, value, closers) if known.get(key) == "string" else None
            open_value = "" if text is None else f"{_compact(key)}:{_compact(text)[:-1]}"
            break
        raw = value[:end]
        if name_suffix and t.arg_name_suffix.endswith("\n") and raw.startswith("\n"):
            raw = raw[1:]
        arguments[key] = typed_value(raw, known.get(key))
        rest = value[end + len(closer):]
        if t.arg_separator:
            rest = skipped if (skipped := _after(rest, trim(t.arg_separator))) is not None \
                else rest
    dumped = dump_arguments(arguments)
    closed = not open_value and any(
        rest.lstrip(WHITESPACE).startswith(c) for c in
        (trim(t.args_end), trim(t.close), trim(t.per_call_end)) if c)
    if closed:
        return dumped, dumped
    certain = dumped[:-1] + ("," if arguments and open_value else "") + open_value
    return certain, certain + ('"}' if open_value else "}")


def _json_arguments(t: ToolAnalysis, body: str) -> tuple[str, str] | None:
    if trim(t.args_start):
        after = _after(body, trim(t.args_start))
        if after is None:
            return None
        body = after
    body = body.lstrip(WHITESPACE)
    if not body:
        return "", "{}"
    try:
        value, _ = json.JSONDecoder(strict=False).raw_decode(body)
    except ValueError:
        return partial_arguments(body)
    if not isinstance(value, dict):
        return None
    dumped = dump_arguments(value)
    return dumped, dumped


def _one_call(t: ToolAnalysis, text: str, types: ParamTypes) -> Partial | None:
    """The call `text` begins with (from its name's prefix on), as far as it is written."""
    named = call_name(t, text, written=False)
    if named is None:
        return None
    name, rest = named
    if t.args_separator:
        if _waiting(rest, (trim(t.args_separator),)):
            return None
        rest = after if (after := _after(rest, trim(t.args_separator))) is not None else rest
    ident = None
    if _has_call_id(t):
        with_id = _call_id(t, rest)
        if with_id is None:  # the id (or the marker after it) is still being written
            return None
        ident, rest = with_id
    if t.mode == "TAG_WITH_TAGGED":
        opener = trim(t.args_start)
        if opener:
            if _waiting(rest, (opener,)):
                return None
            rest = after if (after := _after(rest, opener)) is not None else rest
        starts = (trim(t.arg_name_prefix), trim(t.args_end), trim(t.close),
                  trim(t.per_call_end))
        if not rest.strip(WHITESPACE) or _waiting(rest, starts):
            return None
        certain, guess = _tagged_arguments(t, rest, dict(types.get(name, {})))
    else:
        arguments = _json_arguments(t, rest)
        if arguments is None:
            return None
        certain, guess = arguments
    return name, certain, guess, ident or None


def _call_texts(t: ToolAnalysis, inner: str) -> list[str]:
    """The texts of a block's calls begun so far (as syntax.py's reader splits the block)."""
    per_call, call_end = trim(t.per_call_start), trim(t.per_call_end)
    if per_call and t.section_start:
        after = _after(inner, per_call)
        return [] if after is None else after.split(per_call)
    if per_call:
        return [inner] if call_end else inner.split(per_call)
    return []


def _calls(t: ToolAnalysis, inner: str, types: ParamTypes) -> list[Partial]:
    """Each call of the block begun so far, as far as it is written (those before the last
    are whole)."""
    found = []
    for text in _call_texts(t, inner):
        call = _one_call(t, text, types)
        if call is None:
            break
        found.append(call)
    return found


def partial_reader(t: ToolAnalysis) -> CallsReader | None:
    """The open-block reader of a template's auto-parsed calls (None: not streamed): each call
    begun so far."""
    if t.mode == "JSON_NATIVE":
        plain = (t.name_field, t.args_field) == ("name", "arguments") and \
            t.function_field in ("", "function") and not t.fun_name_is_key and \
            not t.id_field and not (t.per_call_start and t.section_start)

        def read_json(inner: str, _types: ParamTypes) -> list[Partial]:
            body = inner.lstrip(WHITESPACE).removeprefix("[")
            found = partial_call(body)
            return [(*found, None)] if found else []
        return read_json if plain else None
    if t.mode not in ("TAG_WITH_JSON", "TAG_WITH_TAGGED"):
        return None

    def read(inner: str, types: ParamTypes) -> list[Partial]:
        return _calls(t, inner, types)
    return read
