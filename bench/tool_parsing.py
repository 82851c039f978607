"""Side by side over the vendored llama.cpp's chat parser cases (tests/data/chat_cases.json,
ported from its tests/test-chat.cpp by bench/port_chat_cases.py): for each template that has a
tool-call case, llama-server and a llamaq fleet are started on the same model with that
template (`--chat-template-file`), and each case's request is sent to both, whole and streamed;
prints, per template and in all, how many answers are equal.

How the model is made to write a case's raw output: llama-server refuses a `grammar` beside
`tools` ("Cannot use custom grammar constraints with tools."), so the raw output is the content
of a final assistant message that the server continues (prefill; both servers parse the
continued text with the answer, as llama.cpp parses its generation prompt with it), and the
model is made to stop at once (`logit_bias` on its end-of-generation tokens, temperature 0).

The continuation is not free of its own effects: llama-server writes the template's thinking
tags before a continued message (`<think></think>`) and parses them with it, so a reasoning
template's answers carry them; "with equal tool_calls" counts the cases whose calls agree
whatever the content.

Compared: `content`, `reasoning_content` and `tool_calls` (names, arguments as JSON values; ids
only where the case gives one: llama-server makes random ones), whole and the assembled
stream. Reported: templates (families) where llamaq returns a call where llama-server does,
cases equal where llama-server parses a call, content/reasoning-only cases equal, and cases
where llama-server itself fails (an error, or an answer other than the case's expectation).

    python -m bench.tool_parsing [--model GGUF] [--llama-server PATH] [--only SUBSTRING,…]
                                 [--per-template N] [--out ANSWERS.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.processes import free_port, running, server_env, wait_healthy  # noqa: E402
from storage import default_model_path  # noqa: E402
from tests.chat_cases import _openai_message, _tool, cases  # noqa: E402

DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "llamaq-bench" / "bin" / "llama-server"
TEMPLATES = REPO / "tests" / "data" / "templates"
FLAGS = ["-c", "4096", "-np", "1", "-t", "2", "--temp", "0", "--jinja"]
STOP_AT_ONCE = [[1, 100], [106, 100]]
"""Gemma 3's <eos> and <end_of_turn>: the first token sampled ends the answer."""
WHITESPACE = " \t\n\r\f\v"


def request_body(case: dict[str, Any]) -> dict[str, Any]:
    params = case["params"]
    messages = [_openai_message(m) for m in params.get("messages", [])] or \
        [{"role": "user", "content": "Hey there!"}]
    body: dict[str, Any] = {
        "messages": [*messages, {"role": "assistant", "content": case["input"]}],
        "max_tokens": 1, "temperature": 0, "logit_bias": STOP_AT_ONCE,
        "reasoning_format": params.get("reasoning_format", "none"),
        "chat_template_kwargs": {"enable_thinking": params.get("enable_thinking", True)},
        "parallel_tool_calls": params.get("parallel_tool_calls", False)}
    tools = [_tool(name) for name in params.get("tools", [])]
    if tools:
        body["tools"] = tools
        if params.get("tool_choice"):
            body["tool_choice"] = params["tool_choice"]
    return body


def applies(case: dict[str, Any]) -> bool:
    """Cases a server request can pose: not partial, not a continuation of their own."""
    params = case["params"]
    continuation = params.get("continue_final_message")
    return not params.get("is_partial") and not (continuation and continuation != "none") and \
        params.get("add_generation_prompt", True)


def _calls(calls: list[dict[str, Any]], ids: list[str]) -> list[Any]:
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "null")
        except ValueError:
            arguments = function.get("arguments")
        out.append([function.get("name"), arguments, call.get("id") if i < len(ids) and ids[i]
                    else ""])
    return out


def normal(message: dict[str, Any], ids: list[str]) -> dict[str, Any]:
    return {"content": message.get("content") or "",
            "reasoning_content": message.get("reasoning_content") or "",
            "tool_calls": _calls(message.get("tool_calls") or [], ids)}


def loose(answer: dict[str, Any]) -> dict[str, Any]:
    """As llama.cpp's own test compares: content and reasoning stripped."""
    return {**answer, "content": answer["content"].strip(WHITESPACE),
            "reasoning_content": answer["reasoning_content"].strip(WHITESPACE)}


def whole(url: str, body: dict[str, Any], ids: list[str]) -> dict[str, Any] | str:
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    if response.status_code != 200:
        return f"HTTP {response.status_code}: {response.text[:160]}"
    return normal(response.json()["choices"][0]["message"], ids)


def streamed(url: str, body: dict[str, Any], ids: list[str]) -> dict[str, Any] | str:
    content, reasoning = "", ""
    calls: dict[int, dict[str, Any]] = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True},
                      timeout=300) as response:
        if response.status_code != 200:
            return f"HTTP {response.status_code}: {response.read()[:160]!r}"
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return f"error: {json.dumps(chunk['error'])[:160]}"
            for choice in chunk.get("choices", []):
                delta = choice.get("delta") or {}
                content += delta.get("content") or ""
                reasoning += delta.get("reasoning_content") or ""
                for tc in delta.get("tool_calls") or []:
                    entry = calls.setdefault(tc.get("index", 0), {
                        "id": "", "function": {"name": "", "arguments": ""}})
                    entry["id"] = tc.get("id") or entry["id"]
                    function = tc.get("function") or {}
                    entry["function"]["name"] += function.get("name") or ""
                    entry["function"]["arguments"] += function.get("arguments") or ""
    message = {"content": content, "reasoning_content": reasoning,
               "tool_calls": [calls[i] for i in sorted(calls)]}
    return normal(message, ids)


def ask(url: str, case: dict[str, Any]) -> tuple[Any, Any]:
    ids = [c["id"] for c in case["expect"]["tool_calls"]]
    body = request_body(case)
    try:
        return whole(url, body, ids), streamed(url, body, ids)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}", f"{type(exc).__name__}: {exc}"


def serve(command: list[str], log: Path, env: dict[str, str],
          template_cases: list[dict[str, Any]]) -> dict[str, tuple[Any, Any]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running([*command, "--port", str(port)], log, env) as process:
        try:
            wait_healthy(url, timeout_s=300, process=process)
        except (RuntimeError, TimeoutError) as exc:
            return {case["id"]: (f"start: {exc}", f"start: {exc}") for case in template_cases}
        return {case["id"]: ask(url, case) for case in template_cases}


def expected(case: dict[str, Any]) -> dict[str, Any]:
    ids = [c["id"] for c in case["expect"]["tool_calls"]]
    expect = case["expect"]
    calls = [{"id": c["id"], "function": {"name": c["name"], "arguments": c["arguments"]}}
             for c in expect["tool_calls"]]
    return loose(normal({"content": expect["content"],
                         "reasoning_content": expect["reasoning_content"],
                         "tool_calls": calls}, ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", type=Path, default=Path(
        os.environ.get("LLAMA_SERVER_BIN", DEFAULT_LLAMA_SERVER)))
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--only", default="",
                        help="templates whose name has this (or one of these, comma-separated)")
    parser.add_argument("--out", type=Path, default=None, help="write every answer here (JSON)")
    parser.add_argument("--per-template", type=int, default=0,
                        help="at most this many cases a template, tool-call cases first "
                             "(0: all; the whole run takes hours on a busy two-core box)")
    args = parser.parse_args()
    model = args.model or default_model_path(Path.home() / ".cache" / "llamaq-tests")
    if not args.llama_server.exists():
        sys.exit(f"no llama-server at {args.llama_server}: run bench/build_llama_server.sh")
    by_template: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for case in cases():
        if applies(case) and any(o in case["template"] for o in args.only.split(",")):
            by_template[case["template"]].append(case)
    with_calls = {t for t, cs in by_template.items() if any(c["expect"]["tool_calls"]
                                                            for c in cs)}
    if args.per_template:
        for template, template_cases in by_template.items():
            ranked = sorted(template_cases, key=lambda c: not c["expect"]["tool_calls"])
            by_template[template] = ranked[:args.per_template]
    logs = Path(tempfile.mkdtemp(prefix="llamaq-tool-parsing-"))
    env = server_env({"PYTHONPATH": str(REPO)})
    totals: Counter[str] = Counter()
    families: list[str] = []
    report: dict[str, Any] = {}
    for template in sorted(with_calls):
        template_cases = by_template[template]
        stem = template.removesuffix(".jinja")
        flags = ["-m", str(model), *FLAGS, "--chat-template-file", str(TEMPLATES / template)]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            theirs_f = pool.submit(serve, [str(args.llama_server), *flags],
                                   logs / f"{stem}.llama-server.log", env, template_cases)
            ours_f = pool.submit(serve, [sys.executable, "-m", "llamaq", "up", *flags],
                                 logs / f"{stem}.llamaq.log", env, template_cases)
            theirs, ours = theirs_f.result(), ours_f.result()
        seen: Counter[str] = Counter()
        for case in template_cases:
            (t_whole, t_stream), (o_whole, o_stream) = theirs[case["id"]], ours[case["id"]]
            calls = isinstance(t_whole, dict) and bool(t_whole["tool_calls"])
            kind = "call" if calls else "plain"
            ok_theirs = isinstance(t_whole, dict) and loose(t_whole) == expected(case)
            equal = o_whole == t_whole and o_stream == t_stream
            equal_loose = isinstance(o_whole, dict) and isinstance(t_whole, dict) and \
                isinstance(o_stream, dict) and isinstance(t_stream, dict) and \
                loose(o_whole) == loose(t_whole) and loose(o_stream) == loose(t_stream)
            same_calls = all(isinstance(o, dict) and isinstance(t, dict) and
                             o["tool_calls"] == t["tool_calls"]
                             for o, t in ((o_whole, t_whole), (o_stream, t_stream)))
            seen[f"{kind}"] += 1
            seen[f"{kind}_calls_equal"] += same_calls
            seen[f"{kind}_equal"] += equal
            seen[f"{kind}_equal_loose"] += equal_loose
            seen["llama_server_fails"] += not ok_theirs
            if calls and isinstance(o_whole, dict) and o_whole["tool_calls"]:
                seen["ours_calls"] += 1
            report[case["id"]] = {"llama-server": [t_whole, t_stream],
                                  "llamaq": [o_whole, o_stream], "equal": equal,
                                  "equal_loose": equal_loose,
                                  "llama_server_as_expected": ok_theirs}
        totals.update(seen)
        if seen["ours_calls"]:
            families.append(stem)
        print(f"{stem}: calls {seen['call_equal']}/{seen['call']} equal "
              f"({seen['call_equal_loose']} ignoring surrounding whitespace, "
              f"{seen['call_calls_equal']} with equal tool_calls), plain "
              f"{seen['plain_equal']}/{seen['plain']} ({seen['plain_equal_loose']}), "
              f"llama-server unlike the case: {seen['llama_server_fails']}", flush=True)
    print(f"\ntemplates with a tool-call case: {len(with_calls)}; where llamaq returns a call "
          f"where llama-server does: {len(families)}")
    print(f"cases where llama-server parses a call: {totals['call']}, llamaq equal "
          f"{totals['call_equal']} (ignoring surrounding whitespace: "
          f"{totals['call_equal_loose']}; with equal tool_calls: {totals['call_calls_equal']})")
    print(f"content/reasoning-only cases: {totals['plain']}, llamaq equal {totals['plain_equal']} "
          f"({totals['plain_equal_loose']})")
    print(f"cases where llama-server's answer is not the case's expectation (or an error): "
          f"{totals['llama_server_fails']}")
    print(f"logs in {logs}")
    if args.out:
        args.out.write_text(json.dumps(report, ensure_ascii=False, indent=1), "utf-8")


if __name__ == "__main__":
    main()
