"""The vendored llama.cpp's chat parser cases (tests/test-chat.cpp, ported to
tests/data/chat_cases.json by bench/port_chat_cases.py), run through llamaq's own chat path:
each case's template (tests/data/templates) renders the case's request with prepare_chat, and
the parser it picks reads the case's raw model output, whole and fed a character at a time.

Compared as llama.cpp's test compares (`assert_msg_equals(..., ignore_whitespace=true)`):
content and reasoning stripped of surrounding whitespace, arguments as JSON values (partial
ones not compared), ids only where the case expects one (llama-server gives a call without
one a random id)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from api.chat.message import ChatDelta, ChatMessage, ToolCall
from api.chat.prepare import ChatRequest, PreparedChat, prepare_chat
from api.settings import ApiSettings
from scheduler.registry import ModelMeta
from tests.paths import DATA

CASES_FILE = DATA / "chat_cases.json"
TEMPLATES = DATA / "templates"
WHITESPACE = " \t\n\r\f\v"


@cache
def ported() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(CASES_FILE.read_text("utf-8"))
    return loaded


def cases() -> list[dict[str, Any]]:
    return list(ported()["cases"])


def _openai_message(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content", "")}
    if message.get("reasoning_content"):
        out["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        out["tool_calls"] = [{"type": "function", "id": c.get("id") or f"call_{i}",
                              "function": {"name": c["name"], "arguments": c["arguments"]}}
                             for i, c in enumerate(message["tool_calls"])]
    return out


def _tool(name: str) -> dict[str, Any]:
    tool = ported()["tools"][name]
    return {"type": "function", "function": {"name": tool["name"],
                                             "description": tool["description"],
                                             "parameters": tool["parameters"]}}


CONTINUATIONS: dict[str, bool | str] = {"auto": True, "content": "content",
                                        "reasoning": "reasoning_content"}
"""The cases' continue_final_message (llama.cpp's enum) as a request writes it."""


def prepare(case: dict[str, Any]) -> PreparedChat:
    params = case["params"]
    source = (TEMPLATES / case["template"]).read_text("utf-8")
    meta = ModelMeta(vocab_type=2, n_vocab=1000, n_ctx_train=4096, n_embd=64, n_params=1,
                     size=1, chat_template=source, bos_token="<s>", eos_token="</s>")
    messages = [_openai_message(m) for m in params.get("messages", [])] or \
        [{"role": "user", "content": "Hey there!"}]
    tools = [_tool(name) for name in params.get("tools", [])] or None
    continuation = params.get("continue_final_message")
    request = ChatRequest(
        messages=messages, tools=tools, tool_choice=params.get("tool_choice"),
        parallel_tool_calls=params.get("parallel_tool_calls", False),
        chat_template_kwargs={"enable_thinking": params.get("enable_thinking", True)},
        add_generation_prompt=params.get("add_generation_prompt", True),
        continue_final_message=CONTINUATIONS.get(continuation, False),
        reasoning_format=params.get("reasoning_format", "none"),
        json_response=bool(params.get("json_schema")))
    return prepare_chat(ApiSettings.from_args(["--jinja"], environ={}), meta, request)


@dataclass
class Outcome:
    whole: ChatMessage | None
    streamed: ChatMessage | None
    error: str = ""


def assemble(deltas: list[ChatDelta]) -> ChatMessage:
    built: dict[int, list[str]] = {}
    for delta in deltas:
        for tc in delta.tool_calls:
            entry = built.setdefault(tc.index, ["", "", ""])
            if tc.id is not None:
                entry[0] = tc.id
            if tc.name is not None:
                entry[1] = tc.name
            entry[2] += tc.arguments
    reasoning = "".join(d.reasoning_content for d in deltas)
    return ChatMessage(content="".join(d.content for d in deltas),
                       reasoning_content=reasoning or None,
                       tool_calls=[ToolCall(*built[i]) for i in sorted(built)])


def run(case: dict[str, Any]) -> Outcome:
    """The case's answer whole and streamed a character at a time (a partial case: what the
    stream has sent when the text stops, not flushed)."""
    try:
        chat = prepare(case)
    except Exception as exc:
        return Outcome(None, None, f"render: {type(exc).__name__}: {exc}")
    text = case["input"]
    partial = case["params"].get("is_partial", False)
    try:
        parser = chat.parser()
        deltas: list[ChatDelta] = []
        for ch in text:
            deltas += parser.feed(ch)
        if partial:
            return Outcome(assemble(deltas), assemble(deltas))
        deltas += parser.flush()
        return Outcome(chat.parse(text), assemble(deltas))
    except Exception as exc:
        return Outcome(None, None, f"parse: {type(exc).__name__}: {exc}")


def _arguments(text: str) -> Any:
    """Arguments as a JSON value; partial JSON (a call cut short) as "", as llama.cpp's test
    compares them (`renormalize_json`: a partial call's arguments are not compared)."""
    try:
        return json.loads(text)
    except ValueError:
        return ""


def normal(message: ChatMessage | dict[str, Any], ids: list[str]) -> dict[str, Any]:
    """A message as llama.cpp's test compares it; `ids`: the expected ids (kept only where
    one is expected)."""
    if isinstance(message, ChatMessage):
        content, reasoning = message.content, message.reasoning_content or ""
        calls = [(c.name, c.arguments, c.id) for c in message.tool_calls]
    else:
        content, reasoning = message["content"], message["reasoning_content"]
        calls = [(c["name"], c["arguments"], c["id"]) for c in message["tool_calls"]]
    return {"content": content.strip(WHITESPACE), "reasoning_content": reasoning.strip(WHITESPACE),
            "tool_calls": [(name, _arguments(args), ident if i < len(ids) and ids[i] else "")
                           for i, (name, args, ident) in enumerate(calls)]}


def expected(case: dict[str, Any]) -> dict[str, Any]:
    ids = [c["id"] for c in case["expect"]["tool_calls"]]
    return normal(case["expect"], ids)


def verdict(case: dict[str, Any]) -> str:
    """"" when llamaq answers the case as llama.cpp does, both whole and streamed; otherwise
    what differs."""
    outcome = run(case)
    if outcome.error:
        return outcome.error
    want = expected(case)
    ids = [c["id"] for c in case["expect"]["tool_calls"]]
    assert outcome.whole is not None and outcome.streamed is not None
    whole = normal(outcome.whole, ids)
    if whole != want:
        return f"whole: {whole} != {want}"
    streamed = normal(outcome.streamed, ids)
    if streamed != want:
        return f"streamed: {streamed} != {want}"
    return ""
