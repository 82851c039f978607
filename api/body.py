"""Reading a request body into a wire model: malformed JSON, wrong shapes and bodies past the
limits (size per route, nesting depth, NaN/Infinity, lone UTF-16 surrogates) are 400s."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from sanic import Request

from api.errors import validation_message
from scheduler.contract import limits
from scheduler.contract.errors import InvalidRequest

Model = TypeVar("Model", bound=BaseModel)
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: the text may hold a lone one (a pair is fine)."""


def _no_constant(name: str) -> Any:
    raise InvalidRequest(f"Invalid JSON in the request body: {name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidRequest(f"Invalid JSON in the request body: {text} is out of range")
    return value


OFF_LOOP_BYTES = 1 << 20
"""A JSON body at least this big is parsed in a thread as soon as it has arrived."""


def _same(value: Any) -> Any:
    return value


def load_json(raw: bytes, *, yielding: bool = False) -> Any:
    """Parse JSON as llama-server's parser reads it: NaN and Infinity are not JSON, numbers
    must fit a double, strings must be valid Unicode; and no deeper than MAX_JSON_DEPTH.
    `yielding` (in a thread): a Python call for every object, so that the parser (C code,
    which holds the GIL) lets the event loop's thread run every few milliseconds."""
    try:
        value = json.loads(raw, parse_constant=_no_constant, parse_float=_finite,
                           object_hook=_same if yielding else None)
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, huge integers
        raise InvalidRequest(f"Invalid JSON in the request body: {exc}") from None
    deep = raw.count(b"[") + raw.count(b"{") > limits.MAX_JSON_DEPTH
    surrogates = SURROGATE_ESCAPE.search(raw) is not None
    if deep or surrogates:
        _check_shape(value, surrogates)
    return value


def _too_deep() -> InvalidRequest:
    return InvalidRequest(f"Invalid JSON in the request body: nested deeper than "
                          f"{limits.MAX_JSON_DEPTH} levels")


def _check_shape(value: Any, strings: bool) -> None:
    """Nesting depth of arrays and objects; with `strings`, that every string is valid UTF-8
    (a lone surrogate is not)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth >= limits.MAX_JSON_DEPTH:
                raise _too_deep()
            if strings:
                _check_strings(item.keys())
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            if depth >= limits.MAX_JSON_DEPTH:
                raise _too_deep()
            stack.extend((v, depth + 1) for v in item if isinstance(v, dict | list | str))
        elif strings and isinstance(item, str):
            _check_strings((item,))


def _check_strings(values: Any) -> None:
    for value in values:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest("Invalid JSON in the request body: a string holds a lone "
                                 "UTF-16 surrogate, which is not valid Unicode") from None


def raw_body(request: Request) -> bytes:
    """The body, refused when larger than its route's limit."""
    raw = request.body or b""
    prefix: str = request.app.config.get("API_PREFIX", "")  # --api-prefix (api/app/)
    limit = limits.body_limit(request.path, prefix)
    if len(raw) > limit:
        raise InvalidRequest(f"The request body is larger than {limit} bytes, the limit of "
                             f"{request.path}")
    return raw


class FrozenBodies:
    """Big parsed bodies kept out of the cyclic collector's walks while any is alive. The
    millions of objects of one (none in a cycle: refcounts free them) otherwise start full
    collections that walk them all, each holding the GIL ~0.2 s: the pod's loop stalls while
    the body is parsed and for as long as it lives. So the collector pauses during the parse,
    then `gc.freeze()` moves every object alive into its permanent generation; once the last
    request holding such a body has ended, `gc.unfreeze()` hands what is left back to the
    oldest generation (the cyclic garbage of those moments is collected then; a request
    cancelled while its body was parsed holds none, so its moment waits for the next one)."""

    def __init__(self) -> None:
        self._held = 0

    @staticmethod
    def parse(raw: bytes) -> Any:
        """`load_json` of a big body (in a thread), frozen once parsed."""
        gc.disable()  # bodies parsed at once may resume it early; it always ends enabled
        try:
            value = load_json(raw, yielding=True)
            gc.freeze()
            return value
        finally:
            gc.enable()

    def hold(self) -> None:
        """A request holds a body `parse` froze (on the event loop, as `release`)."""
        self._held += 1

    def release(self) -> None:
        """A request that held a frozen body has ended."""
        self._held -= 1
        if self._held == 0:
            gc.unfreeze()


async def parse_ahead(request: Request, bodies: FrozenBodies) -> bool:
    """A big JSON body parsed (and its shape checked) in a thread, not on the event loop (a
    32 MiB body of small objects takes seconds); the result, or its error, waits for
    `json_body`. Called once the body has arrived (api/sanic_app.py). True if `bodies` froze
    it: the caller releases it when the request has ended."""
    raw = request.body or b""
    if len(raw) < OFF_LOOP_BYTES or raw.lstrip()[:1] not in (b"{", b"["):
        return False
    try:
        value: Any = await asyncio.to_thread(bodies.parse, raw)
    except InvalidRequest as error:
        request.ctx.parsed_ahead = (raw, error)
        return False
    bodies.hold()
    request.ctx.parsed_ahead = (raw, value)
    return True


def parsed_json(request: Request, raw: bytes, keep: bool = False) -> Any:
    """The body's JSON: what `parse_ahead` found for these very bytes (then forgotten unless
    `keep`: a handler may change what it gets), else parsed now."""
    ahead = getattr(request.ctx, "parsed_ahead", None)
    if ahead is None or ahead[0] is not raw:
        return load_json(raw) if raw.strip() else None
    if not keep:
        request.ctx.parsed_ahead = None
    if isinstance(ahead[1], InvalidRequest):
        raise ahead[1]
    return ahead[1]


def json_body(request: Request) -> dict[str, Any]:
    raw = raw_body(request)
    body = parsed_json(request, raw)
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object")
    return body


def parse_body(request: Request, model: type[Model]) -> Model:
    try:
        return model.model_validate(json_body(request))
    except ValidationError as exc:
        raise InvalidRequest(validation_message(exc)) from None
    except RecursionError:
        raise _too_deep() from None


def drop_nulls(data: Any) -> Any:
    """A field sent as null counts as absent (llama-server reads it that way)."""
    if isinstance(data, dict):
        return {key: value for key, value in data.items() if value is not None}
    return data
