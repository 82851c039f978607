"""Property-based fuzzing of every endpoint, from the OpenAPI document the api serves.

Bodies are generated from each route's JSON schema (`from_schema` below) and mutated (fields
replaced by hostile values, required fields dropped, broken JSON). Against a tiny GGUF with
n_predict capped, thousands of cases run in minutes. Every answer must be in the spec's error
format when it is an error, and no 5xx except those llama-server itself answers: 501 for a
feature not served (here embeddings, rerank, systemone, slot actions without a save path).
The worker must be alive at the end.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.processes import Fleet

CASES_PER_ROUTE = int(os.environ.get("LLAMAQ_FUZZ_CASES", "120"))
TIME_BUDGET_S = float(os.environ.get("LLAMAQ_FUZZ_SECONDS", "420"))
N_PREDICT_CAP = 8
ALLOWED_5XX = {501: "not_supported_error"}
FEATURE_DISABLED = {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}
HOSTILE_VALUES: list[Any] = [
    None, True, -1, 0, 2**31 - 1, 2**31, -(2**31) - 1, 2**63, -(2**70), 10**30, 1e308, -1e308,
    0.5, -0.5, "", "x" * 5000, "\x00", "😀", "\u202e", [], {}, [[]], [1, "a", None], {"a": {}},
    [-1, 10**9], [[10**9, 1.0]], ["\n"] * 70, "(((((", 'root ::= "a"{99999}',
    [[[[[[[[[[[]]]]]]]]]]],
]
RAW_BODIES = [b"", b"{", b"null", b"[]", b"1", b'"x"', b'{"a":NaN}', b"\xff\xfe", b'{"a":1}}',
              b'{"prompt": "\\ud800"}', b"[" * 5000 + b"]" * 5000]


SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "string": st.text(max_size=24),
    "integer": st.integers(min_value=-2, max_value=64) | st.integers(-(2**33), 2**33),
    "number": st.floats(allow_nan=False, allow_infinity=False, width=32),
    "boolean": st.booleans(),
    "null": st.none(),
}
ANY_JSON: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)


def from_schema(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0
                ) -> st.SearchStrategy[Any]:
    """Values that (mostly) match a pydantic JSON schema: types, properties, required,
    items, anyOf/oneOf, enum, const, bounds and references."""
    if depth > 6:
        return st.none()
    if "$ref" in schema:
        return st.deferred(lambda: from_schema(defs[schema["$ref"].split("/")[-1]], defs,
                                               depth + 1))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return st.one_of([from_schema(s, defs, depth + 1) for s in schema[key]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}, defs, depth) for k in kind])
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        if not props:
            return st.dictionaries(st.text(max_size=8), ANY_JSON, max_size=3)
        fields = {k: from_schema(v, defs, depth + 1) for k, v in props.items()}
        return some_fields(fields, required)
    if kind == "array":
        items = schema.get("items", {})
        element = from_schema(items, defs, depth + 1) if items else ANY_JSON
        return st.lists(element, min_size=min(schema.get("minItems", 0), 3), max_size=4)
    if kind == "integer":
        low, high = schema.get("minimum"), schema.get("maximum")
        if "exclusiveMinimum" in schema:
            low = schema["exclusiveMinimum"] + 1
        return st.integers(min_value=low, max_value=high if high is not None else
                           (low or 0) + 64) | SCALARS["integer"]
    if kind in SCALARS:
        return SCALARS[kind]
    return ANY_JSON


@st.composite
def some_fields(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]],
                required: set[str]) -> dict[str, Any]:
    """The required fields and a few optional ones (a request names a handful of options)."""
    optional = sorted(k for k in fields if k not in required)
    chosen = draw(st.sets(st.sampled_from(optional), max_size=4)) if optional else set()
    return {k: draw(fields[k]) for k in sorted(required & set(fields) | chosen)}


def cap(body: Any) -> Any:
    """Keep generations short: valid n_predict / max_tokens values are capped."""
    if isinstance(body, dict):
        for name in ("n_predict", "max_tokens", "max_completion_tokens", "max_output_tokens"):
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and \
                    -1 <= value < 2**31:
                body[name] = N_PREDICT_CAP if value in (-1,) else min(value, N_PREDICT_CAP)
        if "max_tokens" not in body and "messages" in body:
            body["max_tokens"] = N_PREDICT_CAP
        if "n_predict" not in body and ("prompt" in body or "input_prefix" in body):
            body["n_predict"] = N_PREDICT_CAP
        body.pop("t_max_predict_ms", None)
    return body


def mutated(example: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A generated body with one field replaced by a hostile value, or dropped."""

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        body = draw(example)
        if not isinstance(body, dict) or not body:
            return body
        key = draw(st.sampled_from(sorted(body)))
        if draw(st.booleans()):
            body.pop(key)
        else:
            body[key] = draw(st.sampled_from(HOSTILE_VALUES))
        return body

    return build()


def check_response(response: httpx.Response, where: str) -> None:
    status = response.status_code
    assert status < 500 or ALLOWED_5XX.get(status) is not None, \
        f"{where}: {status} {response.text[:300]}"
    if status >= 400:
        body = response.json()
        if status == 403 and body == FEATURE_DISABLED:
            return  # /tools, /cors-proxy when off: llama-server's body, which has no code
        error = body["error"]
        assert isinstance(error, dict), f"{where}: {body}"
        assert error["code"] == status, f"{where}: {body}"
        assert isinstance(error["message"], str) and isinstance(error["type"], str)
        if status in ALLOWED_5XX:
            assert error["type"] == ALLOWED_5XX[status], f"{where}: {body}"
    elif response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]" and '"error"' in line:
                event = json.loads(line.removeprefix("data: "))
                if "error" in event and isinstance(event["error"], dict):
                    assert set(event["error"]) >= {"code", "message", "type"}, line


@pytest.fixture(scope="module")
def document(tiny_fleet: Fleet) -> dict[str, Any]:
    response = httpx.get(f"{tiny_fleet.api_urls[0]}/openapi.json", timeout=30)
    assert response.status_code == 200
    doc: dict[str, Any] = response.json()
    return doc


def test_openapi_document_lists_every_route(document: dict[str, Any]) -> None:
    paths = document["paths"]
    for path in ("/completion", "/v1/chat/completions", "/v1/messages", "/tokenize",
                 "/v1/systemone", "/slots/{id_slot}", "/health"):
        assert path in paths
    schema = paths["/completion"]["post"]["requestBody"]["content"]["application/json"]
    assert schema["schema"]["$ref"] == "#/components/schemas/CompletionRequest"
    assert "n_probs" in document["components"]["schemas"]["CompletionRequest"]["properties"]


@dataclass
class Tally:
    cases: int = 0
    failures: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)

    def check(self, response: httpx.Response, where: str) -> None:
        self.cases += 1
        self.statuses[response.status_code] += 1
        if os.environ.get("LLAMAQ_FUZZ_SHOW") and response.status_code == 400:
            print(where[:120], response.text[:200])
        try:
            check_response(response, where)
        except (AssertionError, ValueError, KeyError, TypeError) as failure:
            self.failures.append(f"{where}: {failure!r}"[:600])


def fuzz_route(client: httpx.Client, url: str, where: str, bodies: st.SearchStrategy[Any],
               deadline: float, tally: Tally) -> None:
    @settings(max_examples=CASES_PER_ROUTE, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), database=None)
    @given(body=bodies, query=st.sampled_from(["", "?action=save", "?action=erase"]))
    def one_case(body: Any, query: str) -> None:
        if time.monotonic() > deadline:
            return
        content = json.dumps(cap(body), allow_nan=False).encode()
        response = client.post(f"{url}{query}", content=content,
                               headers={"Content-Type": "application/json"})
        tally.check(response, f"{where}{query} {content[:300]!r}")

    one_case()
    for raw in RAW_BODIES:
        response = client.post(url, content=raw, headers={"Content-Type": "application/json"})
        tally.check(response, f"{where} {raw[:40]!r}")


def test_fuzz_every_endpoint(tiny_fleet: Fleet, document: dict[str, Any]) -> None:
    api = tiny_fleet.api_urls[0]
    deadline = time.monotonic() + TIME_BUDGET_S
    tally = Tally()
    components = document["components"]["schemas"]
    routes = [(path, method, operation) for path, methods in document["paths"].items()
              for method, operation in methods.items()]
    started = time.monotonic()
    with httpx.Client(timeout=60) as client:
        for path, method, operation in routes:
            if time.monotonic() > deadline:
                break
            url = api + path.replace("{id_slot}", "0")
            if method == "delete":  # /v1/streams/{record_id}: ids of no stream
                for record in ("x", "0-1.2", "-", "a" * 300, "%00", "x-..-"):
                    tally.check(client.delete(url.replace("{record_id}", record)),
                                f"DELETE {path} {record[:20]}")
                continue
            if method == "get":
                for query in ("", "?fail_on_no_slot=1", "?model=x"):
                    tally.check(client.get(url + query), f"GET {path}{query}")
                continue
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            generated = from_schema(schema, components)
            bodies = st.one_of(generated, generated, mutated(generated), ANY_JSON)
            fuzz_route(client, url, f"POST {path}", bodies, deadline, tally)
        healthy = client.get(f"{api}/health").status_code == 200
    elapsed = time.monotonic() - started
    print(f"\nfuzz: {tally.cases} cases on {len(routes)} routes in {elapsed:.0f} s, "
          f"{len(tally.failures)} failures; answers: {dict(sorted(tally.statuses.items()))}")
    for failure in tally.failures[:20]:
        print(failure)
    assert all(process.poll() is None for process in tiny_fleet.processes), "a process died"
    assert healthy
    assert not tally.failures, tally.failures[:5]
    assert tally.cases >= min(1000, CASES_PER_ROUTE * 8)
    assert tally.statuses[200] >= 50, "hardly any generated body was served"
