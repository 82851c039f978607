"""Side-by-side check of issue 14's points: llamaq and llama-server (built from the same
llama.cpp, see build_llama_server.sh) started with the same flags and model, asked the same
things; prints what each answered and whether the answers agree.

    .venv/bin/python bench/compare_llama_server.py [--llama-server PATH] [--model GGUF]

Not a test (it needs the llama-server binary); the tests of these points are in
tests/fleet/native/test_conformance*.py.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.processes import free_port, running, server_env, wait_healthy  # noqa: E402
from storage import default_model_path  # noqa: E402

DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "llamaq-bench" / "bin" / "llama-server"
FLAGS = ["-c", "256", "-np", "4", "-kvu", "--seed", "42", "--temp", "0.8", "-t", "2",
         "--verbose", "--metrics", "--alias", "gemma,other", "--tags", "t2,t1"]
Check = Callable[[str], Any]


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120)


def sse(url: str, path: str, body: dict[str, Any]) -> list[tuple[str, Any]]:
    """(event name, payload) of each SSE event of a streamed POST."""
    events: list[tuple[str, Any]] = []
    with httpx.stream("POST", url + path, json={**body, "stream": True},
                      timeout=120) as response:
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
                events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


def error_of(response: httpx.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        return [response.status_code, response.text[:80]]
    message = body.get("error", {}).get("message") if isinstance(body, dict) else None
    return [response.status_code, message]


# ------------------------------------------------------------------------- the points


def seed(url: str) -> Any:
    body = {"prompt": "Tell me a story about a cat.", "n_predict": 24}
    first = post(url, "/completion", body).json()["content"]
    second = post(url, "/completion", body).json()["content"]
    streamed = "".join(e["content"] for _, e in sse(url, "/completion", body) if "content" in e)
    return {"same twice": first == second, "stream == non-stream": streamed == first}


def timings(url: str) -> Any:
    one = post(url, "/completion", {"prompt": "I believe", "n_predict": 1}).json()["timings"]
    many = post(url, "/completion", {"prompt": "I believe", "n_predict": 16,
                                     "ignore_eos": True}).json()["timings"]
    steps = many["predicted_per_second"] * many["predicted_ms"] / 1e3
    return {"n=1 per_second": one["predicted_per_second"],
            "n=1 per_token_ms": one["predicted_per_token_ms"], "n=16 steps": round(steps, 3)}


def progress_timings(url: str) -> Any:
    events = [e for _, e in sse(url, "/completion", {
        "prompt": "word " * 40, "n_predict": 2, "return_progress": True,
        "timings_per_token": True, "cache_prompt": False}) if isinstance(e, dict)]
    progress = [e for e in events if "prompt_progress" in e]
    return {"progress events": len(progress), "with timings": sum("timings" in e
                                                                   for e in progress),
            "first processed": progress[0]["prompt_progress"]["processed"] if progress else None}


def kv_exhaustion(url: str) -> Any:
    body = {"prompt": "A", "n_predict": 90, "ignore_eos": True, "cache_prompt": False}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda _: post(url, "/completion", body), range(4)))
    return sorted(str(error_of(r)) if r.status_code != 200 else "200" for r in responses)


def slots_after(url: str) -> Any:
    seen = []
    for n in (1, 4, 8):
        result = post(url, "/completion", {"prompt": "Hello there", "n_predict": n}).json()
        slot = next(s for s in httpx.get(url + "/slots").json() if s["id"] == result["id_slot"])
        token = slot["next_token"][0]
        seen.append((slot["is_processing"], token["n_remain"], token["n_decoded"]))
    return sorted(set(seen))


def response_format(url: str) -> Any:
    out = []
    for fmt in ({"type": "json_object", "schema": 123}, {"type": "json_object",
                                                          "schema": {"type": 123}},
                {"type": "json_object", "schema": {"type": "hiccup"}},
                {"type": "json_object", "schema": {"const": "42"}}):
        response = post(url, "/v1/chat/completions", {
            "max_tokens": 6, "messages": [{"role": "user", "content": "Write an example"}],
            "response_format": fmt})
        out.append(response.status_code)
    return out


def verbose(url: str) -> Any:
    messages = [{"role": "user", "content": "Hi"}]
    chat = post(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 3}).json()
    text = post(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 3}).json()
    native = post(url, "/completion", {"prompt": "Hi", "n_predict": 3}).json()
    chunks = [e for _, e in sse(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 3})
              if isinstance(e, dict)]
    chat_chunks = [e for _, e in sse(url, "/v1/chat/completions",
                                     {"messages": messages, "max_tokens": 3})
                   if isinstance(e, dict)]
    return {"chat": sorted(chat.get("__verbose", {})), "completions": "__verbose" in text,
            "native": "__verbose" in native,
            "completion chunks": sum("__verbose" in c for c in chunks) == len(chunks),
            "chat chunks with it": sum("__verbose" in c for c in chat_chunks)}


def images(url: str) -> Any:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    chat = post(url, "/v1/chat/completions", {"max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "?"}, image]}]})
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    anthropic = post(url, "/v1/messages", {"model": "gemma", "max_tokens": 2, "messages": [
        {"role": "user", "content": [block, {"type": "text", "text": "?"}]}]})
    return {"chat": error_of(chat), "anthropic": error_of(anthropic)}


def anthropic_empty(url: str) -> Any:
    response = post(url, "/v1/messages", {"model": "gemma", "max_tokens": 8, "messages": []})
    return [response.status_code, response.json().get("type")]


def responses_stream(url: str) -> Any:
    events = sse(url, "/v1/responses", {"input": "Say hello. " * 10, "max_output_tokens": 6,
                                        "timings_per_token": True, "return_progress": True,
                                        "cache_prompt": False})
    in_progress = [e for n, e in events if n == "response.in_progress"]
    deltas = [e for n, e in events if n == "response.output_text.delta"]
    return {"in_progress with prompt_progress": sum("prompt_progress" in e
                                                    for e in in_progress) > 0,
            "deltas with timings": bool(deltas) and all("timings" in e for e in deltas)}


def models(url: str) -> Any:
    card = httpx.get(url + "/v1/models").json()["data"][0]
    return {"aliases": card.get("aliases"), "tags": card.get("tags")}


def predict(url: str) -> Any:
    response = post(url, "/predict", {"instances": [
        {"@requestFormat": "chatCompletions", "messages": [{"role": "user", "content": "Hi"}],
         "max_tokens": 3}, {"@requestFormat": "nope"}]})
    if response.status_code != 200:
        return error_of(response)
    chat, unknown = response.json()["predictions"]
    return [chat.get("object"), unknown.get("error", {}).get("message")]


def metrics_header(url: str) -> Any:
    return "Process-Start-Time-Unix" in httpx.get(url + "/metrics").headers


def second_host(url: str) -> Any:
    return httpx.get(url.replace("127.0.0.1", "127.0.0.2") + "/health").status_code


POINTS: list[tuple[str, Check]] = [
    ("--seed seeds every request", seed), ("timings over n-1 steps", timings),
    ("timings on prompt_progress", progress_timings), ("slots idle after response", slots_after),
    ("response_format schemas", response_format), ("--verbose __verbose", verbose),
    ("images without mmproj", images), ("anthropic empty messages", anthropic_empty),
    ("responses stream progress/timings", responses_stream), ("models aliases/tags", models),
    ("POST /predict", predict), ("/metrics header", metrics_header),
    ("--host a,b", second_host), ("shared KV pool exhausted", kv_exhaustion),
]


def observe(command: list[str], log: Path) -> dict[str, Any]:
    port = free_port()
    env = server_env({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port)})
    url = f"http://127.0.0.1:{port}"
    seen: dict[str, Any] = {}
    with running([*command, "--host", "127.0.0.1,127.0.0.2", "--port", str(port)], log, env):
        wait_healthy(url)
        for name, check in POINTS:
            try:
                seen[name] = check(url)
            except Exception as exc:  # a difference to report, not a crash of the script
                seen[name] = f"{type(exc).__name__}: {exc}"[:120]
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", type=Path, default=Path(
        os.environ.get("LLAMA_SERVER_BIN", DEFAULT_LLAMA_SERVER)))
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    model = args.model or default_model_path(REPO / ".llamaq" / "cache")
    if not args.llama_server.exists():
        sys.exit(f"no llama-server at {args.llama_server}: run bench/build_llama_server.sh")
    logs = Path(tempfile.mkdtemp(prefix="llamaq-compare-"))
    reference = observe([str(args.llama_server), "-m", str(model), *FLAGS],
                        logs / "llama-server.log")
    ours = observe([str(REPO / ".venv" / "bin" / "llamaq"), "up", "-m", str(model), *FLAGS],
                   logs / "llamaq.log")
    same = 0
    for name, _ in POINTS:
        agree = reference[name] == ours[name]
        same += agree
        print(f"{'same' if agree else 'DIFF'}  {name}\n    llama-server: "
              f"{json.dumps(reference[name])}\n    llamaq:       {json.dumps(ours[name])}")
    print(f"\n{same}/{len(POINTS)} points agree (logs in {logs})")


if __name__ == "__main__":
    main()
