"""One chat preparation for every API family that speaks chat (OpenAI chat completions and
Responses, Anthropic Messages), as llama-server runs them all through
`oaicompat_chat_params_parse`.

Owns: checking messages and tools (and --jinja for them), the forced tool call's grammar and
its system hint, rendering the template (continuing a final assistant message under
--prefill-assistant), the reasoning budget, and how to read the model's output (reasoning
format, tool-call parsing). Hands off: each API's own fields become a ChatRequest in its route
(the Anthropic wire model converts itself to OpenAI's shapes first).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from api.chat.autoparse.forced import auto_call_frame
from api.chat.caps import chat_template_caps
from api.chat.chat_formats import (
    FUNCTIONARY_V3_2,
    GPT_OSS,
    call_frame,
    continuation_tags,
    detect_chat_format,
    llama_auto_parsed,
    preserved_tokens,
)
from api.chat.delimiters import chat_delimiters
from api.chat.fenced_json import FencedJsonParser
from api.chat.functionary import FunctionaryParser
from api.chat.harmony import HarmonyParser
from api.chat.message import ChatDelta, ChatMessage, OutputParser
from api.chat.messages import MediaInput, validate_messages
from api.chat.parsing import ChatOutputParser
from api.chat.reasoning import reasoning_spec
from api.chat.reasoning_tags import prompt_opens_thinking, reasoning_tags
from api.chat.request_tools import ToolChoice, tool_names, validate_tool_choice, validate_tools
from api.chat.tagged_calls import param_types
from api.chat.templates import ChatTemplate, template_kwargs
from api.chat.tool_formats import WHITESPACE
from api.chat.tool_grammar import add_system_hint, native_tool_call, tool_call_grammar
from api.settings import ApiSettings
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob, ReasoningSpec
from scheduler.contract.message_delimiters import MessageDelimiter
from scheduler.registry import ModelMeta

log = logging.getLogger(__name__)


@dataclass
class ChatRequest:
    """A chat request in OpenAI's shapes, whichever API it came in; None: the server's."""

    messages: Any
    tools: Any
    tool_choice: Any
    """OpenAI's `tool_choice` as sent (checked here against the tools), or a ToolChoice
    already checked (the Anthropic wire model converts and checks its own)."""
    parallel_tool_calls: bool | None = True
    """None: as the template allows (llama-server's default, its caps'
    supports_parallel_tool_calls)."""
    chat_template_kwargs: Mapping[str, Any] | None = None
    reasoning_effort: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool | str | None = None
    """A string: "content" or "reasoning_content", the part continued (templates.py)."""
    allow_empty: bool = False
    """Anthropic: an empty message list renders (count_tokens of nothing but a system)."""
    reasoning_format: str | None = None
    reasoning_budget: int | None = None
    reasoning_budget_message: str | None = None
    reasoning_control: bool = False
    json_response: bool = False
    """The answer is held to a JSON schema: a Markdown fence around it is not content."""


LLAMA_CPP_FORMATS = {"gemma4": "peg-gemma4", "minimax-m3": "peg-minimax-m3"}
"""llama.cpp's format names that are not `peg-native`, by llamaq's family name."""


@dataclass
class PreparedChat:
    """A chat request made ready to run: its rendered prompt and how to read the output."""

    template: ChatTemplate
    prompt: str
    tools: list[dict[str, Any]]
    tool_choice: ToolChoice
    tool_schema: str | None
    """The JSON schema a forced tool call must follow, as JSON text."""
    reasoning_format: str
    parse_tools: bool
    reasoning: ReasoningSpec | None = None
    parallel_tool_calls: bool = True
    preserved_tokens: list[str] = field(default_factory=list)
    """The special tokens the worker must write as text for the parser (the job's)."""
    media: MediaInput | None = None
    """The media the messages hold (their markers are in `prompt`); None: a text-only model."""
    message_delimiters: list[MessageDelimiter] = field(default_factory=list)
    """Where the template's messages start (api/chat/delimiters.py)."""
    tool_frame: list[str] | None = None
    """The forced call's markers around `tool_schema` (the job's `json_schema_frame`)."""
    prefill: str = ""
    """What a continued final assistant message added to the prompt: the parser reads it as
    the start of the answer, so the answer holds it (as llama-server's does)."""
    json_response: bool = False
    """The answer is held to a JSON schema (fenced_json.py)."""

    @property
    def chat_format(self) -> str:
        """The parser's name as llama-server gives it (`chat_format` of generation_settings):
        one PEG parser for every Jinja template but Gemma 4's and MiniMax-M3's (common/chat.cpp
        `common_chat_format_name`); llamaq's own family is in the log (`chat format:`)."""
        family = detect_chat_format(self.template.source).name
        return LLAMA_CPP_FORMATS.get(family, "peg-native")

    def fill(self, job: CompletionJob) -> None:
        """Give the prompt's job what the worker needs of this chat beside the prompt."""
        job.reasoning = self.reasoning
        job.chat_format, job.reasoning_format = self.chat_format, self.reasoning_format
        job.preserved_tokens = self.preserved_tokens
        job.message_delimiters = self.message_delimiters
        if self.tool_frame is not None and job.json_schema == self.tool_schema:
            job.json_schema_frame = list(self.tool_frame)
        for stop in detect_chat_format(self.template.source).stops:
            if stop not in job.stop:
                job.stop.append(stop)

    def parser(self) -> OutputParser:
        parser = self._parser()
        return FencedJsonParser(parser) if self.json_response else parser

    def _parser(self) -> OutputParser:
        names = tool_names(self.tools) if self.parse_tools else None
        chat_format = detect_chat_format(self.template.source)
        if chat_format is GPT_OSS:  # a continued message: its channels read with the answer
            harmony = HarmonyParser(reasoning_format=self.reasoning_format, tools=self.parse_tools,
                                    prompt=self.prompt[:len(self.prompt) - len(self.prefill)],
                                    tool_names=names, parallel_tool_calls=self.parallel_tool_calls)
            return SeededParser(harmony, self.prefill) if self.prefill else harmony
        if chat_format is FUNCTIONARY_V3_2:
            prompt = self.prompt[:len(self.prompt) - len(self.prefill)]
            functionary = FunctionaryParser(tools=self.parse_tools, prompt=prompt,
                                            tool_names=names,
                                            parallel_tool_calls=self.parallel_tool_calls)
            return SeededParser(functionary, self.prefill) if self.prefill else functionary
        prompt = self.prompt[:len(self.prompt) - len(self.prefill)]
        start_tag, _ = chat_format.reasoning or reasoning_tags(self.template.source)
        forced_open = (chat_format.reasoning is not None and \
            prompt.rstrip(WHITESPACE).endswith(start_tag)) or \
            prompt_opens_thinking(prompt, self.template.source)
        if self.tool_frame and self.tool_frame[0].strip():
            # a forced call starts at once, in a thinking block the prompt opened
            chat_format = replace(chat_format, reasoning_ends=(
                *chat_format.reasoning_ends, self.tool_frame[0].strip()))
        parser = ChatOutputParser(
            reasoning_format=self.reasoning_format, tools=self.parse_tools,
            template_source=self.template.source, thinking_forced_open=forced_open,
            opened=prompt[prompt.rfind(start_tag):] if forced_open else "",
            tool_names=names, chat_format=chat_format, param_types=param_types(self.tools),
            parallel_tool_calls=self.parallel_tool_calls)
        seed = self.prefill
        preamble = prompt[prompt.rfind(start_tag) + len(start_tag):] if forced_open else ""
        if preamble.strip(WHITESPACE) and not seed and self.reasoning_format != "none":
            seed = preamble  # Apriel 1.6's "Here are my reasoning steps:", reasoning parsed
        return SeededParser(parser, seed) if seed else parser

    def parse(self, text: str) -> ChatMessage:
        parser = self.parser()
        parser.feed(text)
        return parser.finish()


class SeededParser:
    """A parser that has read `seed` (a continued message's text) before the answer: the
    deltas of the seed come with the answer's first ones."""

    def __init__(self, parser: OutputParser, seed: str) -> None:
        self._parser = parser
        self._pending = parser.feed(seed)

    def _with_pending(self, deltas: list[ChatDelta]) -> list[ChatDelta]:
        pending, self._pending = self._pending, []
        return pending + deltas

    def feed(self, text: str) -> list[ChatDelta]:
        return self._with_pending(self._parser.feed(text))

    def flush(self) -> list[ChatDelta]:
        return self._with_pending(self._parser.flush())

    def finish(self) -> ChatMessage:
        return self._parser.finish()


def prepare_chat(settings: ApiSettings, meta: ModelMeta | None,
                 request: ChatRequest) -> PreparedChat:
    """Check the messages and tools, render the template, decide how to parse the output."""
    media = media_input(meta)
    messages = validate_messages(request.messages, allow_empty=request.allow_empty, media=media)
    tools = validate_tools(request.tools)
    choice = request.tool_choice
    if not isinstance(choice, ToolChoice):
        choice = validate_tool_choice(choice, tools)
    if not settings.jinja:
        if tools:
            raise InvalidRequest("tools param requires --jinja flag")
        if choice.mode != "auto":
            raise InvalidRequest("tool_choice param requires --jinja flag")
    parse_tools = bool(tools) and choice.mode != "none"
    template = ChatTemplate.for_model(settings, meta)
    family = detect_chat_format(template.source).name
    log.debug("chat format: %s (llamaq's %s parser)", LLAMA_CPP_FORMATS.get(family, "peg-native"),
              family)
    frame = call_frame(template.source)
    if frame is None and tools and choice.mode == "required":
        frame = auto_call_frame(template.source, tools, choice,
                                tagged=llama_auto_parsed(template.source))
    tool_frame: list[str] | None = None
    schema: str | None
    if frame is not None and tools and choice.mode == "required":
        schema, tool_frame = native_tool_call(tools, choice, bool(request.parallel_tool_calls),
                                              frame)
    else:
        schema, hint = tool_call_grammar(tools, choice, bool(request.parallel_tool_calls))
        if hint:
            messages = add_system_hint(messages, hint)
    continue_final = request.continue_final_message
    if continue_final is None and not settings.prefill_assistant:
        continue_final = False
    prompt, prefill = template.render_continued(
        messages, tools=tools or None, add_generation_prompt=request.add_generation_prompt,
        extra_context=template_kwargs(settings, request.chat_template_kwargs,
                                      request.reasoning_effort),
        continue_final_message=continue_final, allow_empty=request.allow_empty,
        thinking_tags=continuation_tags(template.source))
    reasoning_format = request.reasoning_format or settings.reasoning_format
    if settings.skip_chat_parsing:
        reasoning_format, parse_tools = "none", False
    budget = settings.reasoning_budget if request.reasoning_budget is None \
        else request.reasoning_budget
    message = request.reasoning_budget_message or settings.reasoning_budget_message or ""
    reasoning = reasoning_spec(template.source, prompt, budget, message,
                               request.reasoning_control)
    parallel = request.parallel_tool_calls
    if parallel is None:
        parallel = template.builtin or chat_template_caps(template.source)[
            "supports_parallel_tool_calls"]
    return PreparedChat(template, prompt, tools, choice, schema, reasoning_format, parse_tools,
                        reasoning, parallel, preserved_tokens(template.source),
                        media if media is not None and media.sources else None,
                        chat_delimiters(settings, template), tool_frame=tool_frame,
                        prefill=prefill, json_response=request.json_response)


def media_input(meta: ModelMeta | None) -> MediaInput | None:
    """What the model's projector takes (its workers report it), None without one."""
    if meta is None or not meta.takes_media():
        return None
    return MediaInput(marker=meta.media_marker, vision=meta.modalities.get("vision", False),
                      audio=meta.modalities.get("audio", False),
                      video=meta.modalities.get("video", False))
