"""Results in the OpenAI shapes llama-server gives them: text_completion, chat.completion and
chat.completion.chunk objects, usage, timings and logprobs (server-task.cpp to_json_oaicompat*),
and the Responses API's objects and events."""

from __future__ import annotations

import json
import secrets
import string
import time
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from typing import TYPE_CHECKING, Any

from api.endpoints.native.render import probs_json
from scheduler.contract.results import CompletionResult, TokenProbs

if TYPE_CHECKING:
    from api.chat.message import ChatDelta, ChatMessage

ID_ALPHABET = string.ascii_letters + string.digits


def random_id(prefix: str = "", length: int = 32) -> str:
    return prefix + "".join(secrets.choice(ID_ALPHABET) for _ in range(length))


@cache
def system_fingerprint() -> str:
    try:
        return f"llamaq-{metadata.version('llamaq')}"
    except metadata.PackageNotFoundError:
        return "llamaq"


@dataclass
class Envelope:
    """What every object and chunk of one response repeats."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def wrap(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "created": self.created, "model": self.model,
                "system_fingerprint": system_fingerprint(), "object": kind, "id": self.id}


def finish_reason(result: CompletionResult, tool_calls: bool = False) -> str:
    if result.stop_type in ("eos", "word"):
        return "tool_calls" if tool_calls else "stop"
    return "length"


def usage_json(results: list[CompletionResult], per_prompt: int = 0) -> dict[str, Any]:
    """Tokens of all choices; the `per_prompt` choices of one prompt share it, so it counts
    once (all choices share one prompt by default)."""
    prompts = results[:: per_prompt or len(results)]
    prompt = sum(result.tokens_evaluated for result in prompts)
    cached = sum(result.timings.cache_n for result in prompts)
    completion = sum(result.tokens_predicted for result in results)
    return {"completion_tokens": completion, "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def timings_json(result: CompletionResult) -> dict[str, Any]:
    return result.timings.model_dump()


def logprobs_json(probs: list[TokenProbs] | None,
                  post_sampling: bool = False) -> dict[str, Any] | None:
    if not probs:
        return None
    return {"content": probs_json(probs, post_sampling)}


def result_logprobs(result: CompletionResult) -> dict[str, Any] | None:
    return logprobs_json(result.probs, result.post_sampling_probs)


# /v1/completions


def text_completion_json(envelope: Envelope, results: list[CompletionResult],
                         per_prompt: int = 1) -> dict[str, Any]:
    """Choice i is results[i]; `per_prompt` consecutive choices share a prompt."""
    choices = [{"text": result.content, "index": index, "logprobs": result_logprobs(result),
                "finish_reason": finish_reason(result)} for index, result in enumerate(results)]
    body = envelope.wrap("text_completion", {"choices": choices})
    body["usage"] = usage_json(results, per_prompt)
    body["timings"] = timings_json(results[0])
    return body


def text_chunk_json(envelope: Envelope, index: int, text: str,
                    logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    choice = {"text": text, "index": index, "logprobs": logprobs, "finish_reason": None}
    return envelope.wrap("text_completion", {"choices": [choice]})


def text_final_chunk_json(envelope: Envelope, index: int,
                          result: CompletionResult) -> dict[str, Any]:
    """The last chunk of one choice: its remaining text, finish reason, usage and timings."""
    choice = {"text": result.content, "index": index, "logprobs": None,
              "finish_reason": finish_reason(result)}
    body = envelope.wrap("text_completion", {"choices": [choice]})
    body["usage"] = usage_json([result])
    body["timings"] = timings_json(result)
    return body


# /v1/chat/completions


def message_json(message: ChatMessage) -> dict[str, Any]:
    body: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.reasoning_content:
        body["reasoning_content"] = message.reasoning_content
    if message.tool_calls:
        body["tool_calls"] = [{
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
            "id": call.id,
        } for call in message.tool_calls]
    return body


def chat_completion_json(envelope: Envelope,
                         choices: list[tuple[int, CompletionResult, ChatMessage]]
                         ) -> dict[str, Any]:
    rendered = []
    for index, result, message in choices:
        choice: dict[str, Any] = {
            "finish_reason": finish_reason(result, bool(message.tool_calls)),
            "index": index,
            "message": message_json(message),
        }
        logprobs = result_logprobs(result)
        if logprobs is not None:
            choice["logprobs"] = logprobs
        rendered.append(choice)
    body = envelope.wrap("chat.completion", {"choices": rendered})
    body["usage"] = usage_json([result for _, result, _ in choices])
    body["timings"] = timings_json(choices[0][1])
    return body


def delta_json(delta: ChatDelta) -> dict[str, Any]:
    """One parsed increment as an OpenAI delta (server_chat_msg_diff_to_json_oaicompat)."""
    body: dict[str, Any] = {}
    if delta.reasoning_content:
        body["reasoning_content"] = delta.reasoning_content
    if delta.content:
        body["content"] = delta.content
    if delta.tool_calls:
        calls = []
        for call in delta.tool_calls:
            rendered: dict[str, Any] = {"index": call.index}
            if call.id:
                rendered["id"] = call.id
                rendered["type"] = "function"
            function = {}
            if call.name:
                function["name"] = call.name
            if call.arguments:
                function["arguments"] = call.arguments
            if function:
                rendered["function"] = function
            calls.append(rendered)
        body["tool_calls"] = calls
    return body


ROLE_DELTA: dict[str, Any] = {"role": "assistant", "content": None}
"""The first chunk of each choice, as OpenAI sends it."""


def chat_chunk_json(envelope: Envelope, index: int, delta: dict[str, Any],
                    finish: str | None = None,
                    logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"finish_reason": finish, "index": index, "delta": delta}
    if logprobs is not None:
        choice["logprobs"] = logprobs
    return envelope.wrap("chat.completion.chunk", {"choices": [choice]})


def chat_usage_chunk_json(envelope: Envelope, results: list[CompletionResult]) -> dict[str, Any]:
    """`stream_options.include_usage`: a last chunk with usage and no choices."""
    body = envelope.wrap("chat.completion.chunk", {"choices": []})
    body["usage"] = usage_json(results)
    return body


# /v1/responses (to_json_oaicompat_resp and _resp_stream)


def responses_usage_json(results: list[CompletionResult]) -> dict[str, Any]:
    usage = usage_json(results)
    return {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
            "input_tokens_details": usage["prompt_tokens_details"]}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "summary": [], "type": "reasoning",
            "content": [{"text": text, "type": "reasoning_text"}] if text else [],
            "encrypted_content": "", "status": status}


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    return {"content": [] if text is None else [output_text_part(text)], "id": item_id,
            "role": "assistant", "status": status, "type": "message"}


def function_call_item(call_id: str, name: str, arguments: str,
                       status: str = "completed") -> dict[str, Any]:
    return {"id": "fc_" + call_id, "type": "function_call", "status": status,
            "arguments": arguments, "call_id": "call_" + call_id, "name": name}


def response_json(envelope: Envelope, message: ChatMessage, results: list[CompletionResult],
                  status: str = "completed", reasoning_id: str | None = None,
                  message_id: str | None = None) -> dict[str, Any]:
    """The `response` object: reasoning, message and function_call output items."""
    output = []
    if message.reasoning_content:
        output.append(reasoning_item(reasoning_id or random_id("rs_"),
                                     message.reasoning_content))
    if message.content:
        output.append(message_item(message_id or random_id("msg_"), message.content))
    output.extend(function_call_item(call.id, call.name, call.arguments)
                  for call in message.tool_calls)
    return {"completed_at": int(time.time()), "created_at": envelope.created,
            "id": envelope.id, "model": envelope.model, "object": "response", "output": output,
            "status": status, "usage": responses_usage_json(results)}


ResponseEvent = tuple[str, dict[str, Any]]


class ResponseEvents:
    """The Responses stream's events for one answer: response.created / in_progress, an
    output item per reasoning block, message and function call with their deltas, their
    .done events, then response.completed. Events carry `sequence_number` and
    `output_index` (and `content_index`) as OpenAI's do."""

    def __init__(self, envelope: Envelope) -> None:
        self.envelope = envelope
        self.reasoning_id = random_id("rs_")
        self.message_id = random_id("msg_")
        self._sequence = 0
        self._outputs = 0
        self._reasoning_index: int | None = None
        self._message_index: int | None = None
        self._calls: dict[int, tuple[int, str]] = {}  # call index → output index, call id

    def _event(self, kind: str, **data: Any) -> ResponseEvent:
        event = {"type": kind, **data, "sequence_number": self._sequence}
        self._sequence += 1
        return kind, event

    def _summary(self, status: str) -> dict[str, Any]:
        return {"id": self.envelope.id, "object": "response", "created_at": self.envelope.created,
                "status": status, "model": self.envelope.model, "output": []}

    def start(self) -> list[ResponseEvent]:
        return [self._event("response.created", response=self._summary("in_progress")),
                self._event("response.in_progress", response=self._summary("in_progress"))]

    def in_progress(self) -> ResponseEvent:
        """Another response.in_progress (prompt progress rides on it)."""
        return self._event("response.in_progress", response=self._summary("in_progress"))

    def _new_output(self) -> int:
        self._outputs += 1
        return self._outputs - 1

    def delta(self, delta: ChatDelta) -> list[ResponseEvent]:
        events = []
        if delta.reasoning_content:
            if self._reasoning_index is None:
                self._reasoning_index = self._new_output()
                events.append(self._event(
                    "response.output_item.added", output_index=self._reasoning_index,
                    item=reasoning_item(self.reasoning_id, "", "in_progress")))
            events.append(self._event(
                "response.reasoning_text.delta", item_id=self.reasoning_id,
                output_index=self._reasoning_index, content_index=0,
                delta=delta.reasoning_content))
        if delta.content:
            if self._message_index is None:
                self._message_index = self._new_output()
                events.append(self._event(
                    "response.output_item.added", output_index=self._message_index,
                    item=message_item(self.message_id, None, "in_progress")))
                events.append(self._event(
                    "response.content_part.added", item_id=self.message_id,
                    output_index=self._message_index, content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []}))
            events.append(self._event(
                "response.output_text.delta", item_id=self.message_id,
                output_index=self._message_index, content_index=0, delta=delta.content,
                logprobs=[]))
        for call in delta.tool_calls:
            if call.index not in self._calls and call.name:
                call_id = call.id or random_id()
                self._calls[call.index] = (self._new_output(), call_id)
                events.append(self._event(
                    "response.output_item.added", output_index=self._calls[call.index][0],
                    item=function_call_item(call_id, call.name, "", "in_progress")))
            if call.arguments and call.index in self._calls:
                output_index, call_id = self._calls[call.index]
                events.append(self._event(
                    "response.function_call_arguments.delta", item_id="fc_" + call_id,
                    output_index=output_index, delta=call.arguments))
        return events

    def finish(self, message: ChatMessage, results: list[CompletionResult]
               ) -> list[ResponseEvent]:
        events = []
        output = []
        if message.reasoning_content:
            item = reasoning_item(self.reasoning_id, message.reasoning_content)
            index = self._reasoning_index if self._reasoning_index is not None else 0
            events.append(self._event("response.output_item.done", output_index=index,
                                      item=item))
            output.append(item)
        if message.content:
            index = self._message_index if self._message_index is not None else len(output)
            part = output_text_part(message.content)
            events.append(self._event("response.output_text.done", item_id=self.message_id,
                                      output_index=index, content_index=0,
                                      text=message.content, logprobs=[]))
            events.append(self._event("response.content_part.done", item_id=self.message_id,
                                      output_index=index, content_index=0, part=part))
            item = message_item(self.message_id, message.content)
            events.append(self._event("response.output_item.done", output_index=index,
                                      item=item))
            output.append(item)
        streamed_ids = {i: call_id for i, (_, call_id) in self._calls.items()}
        for i, call in enumerate(message.tool_calls):
            call_id = streamed_ids.get(i, call.id)
            item = function_call_item(call_id, call.name, call.arguments)
            index = self._calls[i][0] if i in self._calls else len(output)
            events.append(self._event("response.output_item.done", output_index=index,
                                      item=item))
            output.append(item)
        completed = {**self._summary("completed"), "output": output,
                     "usage": responses_usage_json(results)}
        events.append(self._event("response.completed", response=completed))
        events[-1][1]["timings"] = timings_json(results[0])
        return events


def sse_event(event: ResponseEvent) -> str:
    """An SSE event with its name, as the Responses API frames them."""
    kind, data = event
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"
