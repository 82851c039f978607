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


FREEZE_MAX_S = 10.0
"""The heap stays frozen at most this long after a big body froze it, whoever holds one."""


class FrozenBodies:
    """Big parsed bodies kept out of the cyclic collector's walks while they are handled. The
    millions of objects of one (none in a cycle: refcounts free them) otherwise start full
    collections that walk them all, each holding the GIL ~0.2 s: the pod's loop stalls while
    the body is parsed and handled. So the collector pauses during the parse, then
    `gc.freeze()` moves every object alive into its permanent generation; `gc.unfreeze()`
    hands what is left back to the oldest generation (the cyclic garbage of that moment is
    collected then) once the last request holding such a body has ended, and at the latest
    FREEZE_MAX_S after the freeze: a long stream (a padded body, a slow client) or big bodies
    arriving one after another never keep the heap frozen longer (frozen objects that became
    cyclic garbage are never freed), and neither does a request cancelled while its body was
    parsed (which holds none). A request still holding its body then costs a full collection
    or two, once."""

    def __init__(self, max_s: float = FREEZE_MAX_S) -> None:
        self._max_s = max_s
        self._held = 0
        self._period = 0
        """Counts the unfreezes: a hold of an earlier period has nothing left to release."""
        self._deadline: asyncio.TimerHandle | None = None

    def parse(self, raw: bytes, loop: asyncio.AbstractEventLoop | None = None) -> Any:
        """`load_json` of a big body (in a thread), frozen once parsed; `loop`: the pod's,
        which unfreezes it at the latest FREEZE_MAX_S later."""
        gc.disable()  # bodies parsed at once may resume it early; it always ends enabled
        try:
            value = load_json(raw, yielding=True)
            gc.freeze()
            if loop is not None:
                loop.call_soon_threadsafe(self._arm)
            return value
        finally:
            gc.enable()

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = asyncio.get_running_loop().call_later(self._max_s, self._unfreeze)

    def hold(self) -> int:
        """A request holds a body `parse` froze (on the event loop, as `release`); returns
        the hold's period, for `release`."""
        self._held += 1
        return self._period

    def release(self, period: int | None = None) -> None:
        """A request that held a frozen body (since `period`: the current one if None) has
        ended."""
        if period is not None and period != self._period:
            return  # unfrozen since (FREEZE_MAX_S)
        self._held -= 1
        if self._held <= 0:
            self._unfreeze()

    def _unfreeze(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        gc.unfreeze()
        self._held = 0
        self._period += 1


async def parse_ahead(request: Request, bodies: FrozenBodies) -> int | None:
    """A big JSON body parsed (and its shape checked) in a thread, not on the event loop (a
    32 MiB body of small objects takes seconds); the result, or its error, waits for
    `json_body`. Called once the body has arrived (api/sanic_app.py). The hold's period if
    `bodies` froze it: the caller releases it when the request has ended."""
    raw = request.body or b""
    if len(raw) < OFF_LOOP_BYTES or raw.lstrip()[:1] not in (b"{", b"["):
        return None
    try:
        value: Any = await asyncio.to_thread(bodies.parse, raw, asyncio.get_running_loop())
    except InvalidRequest as error:
        request.ctx.parsed_ahead = (raw, error)
        return None
    request.ctx.parsed_ahead = (raw, value)
    return bodies.hold()


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
