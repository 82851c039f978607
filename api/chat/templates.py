"""Chat templates: OpenAI-style messages → the prompt text a model expects.

Templates are Jinja, rendered in a sandbox the way Hugging Face transformers and llama.cpp render
them (`trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`, `strftime_now`, a
`tojson` that does not HTML-escape). Which template applies (:meth:`ChatTemplate.for_model`):
`--chat-template-file` > `--chat-template` (a built-in name, or a Jinja string) > the model's own
template (GGUF metadata, published by its workers) > chatml.

Messages are normalized before rendering as llama-server does: text content parts joined with
"\\n" (or kept as parts when the template only reads parts), `null` content as "", `developer`
as `system` (except for gpt-oss templates), a leading system message merged into the next one when
the template ignores system messages, tool-call arguments as objects when the template wants
objects. A final assistant message is continued (prefill): see :meth:`ChatTemplate.render`.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Template, TemplateError, Undefined, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import SandboxedEnvironment

from api.chat.builtin import BUILTIN_TEMPLATES, builtin_template_names, detect_builtin_template
from api.chat.messages import media_part_error
from api.settings import ApiSettings
from scheduler.contract.errors import InvalidRequest, ServerError
from scheduler.registry import ModelMeta

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "chatml"
MEDIA_PARTS = frozenset({"image_url", "input_audio", "input_video", "image", "file"})
RENDER_ERRORS = (TemplateError, TypeError, ValueError, LookupError, AttributeError,
                 ArithmeticError)

__all__ = ["ChatTemplate", "builtin_template_names", "template_kwargs",
           "validate_chat_template_setting"]


# --- the Jinja environment -------------------------------------------------------------------

class _GenerationTag(Extension):
    """Hugging Face's `{% generation %}…{% endgeneration %}` (marks assistant text for
    training masks): rendered as its body."""

    tags = {"generation"}  # noqa: RUF012 (typed by jinja2 as a set)

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _json_default(value: Any) -> Any:
    if isinstance(value, Undefined):
        return None
    if isinstance(value, Iterable):  # what `map`, `select`, … give: generators
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' `tojson`: plain `json.dumps` (Jinja's own escapes HTML characters)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys, default=_json_default)


def _environment() -> SandboxedEnvironment:
    """The sandbox. Not the immutable one transformers uses: llama.cpp's engine lets templates
    append to their own lists (Kimi K2's does), and what they get is a deep copy anyway."""
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                               extensions=["jinja2.ext.loopcontrols", _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# --- what a template can take (llama.cpp's template "caps", probed by rendering) ---------------

@dataclass(frozen=True)
class _Caps:
    system_role: bool = True          # False: a leading system message is merged into the next
    typed_content_only: bool = False  # True: string content is passed as [{"type": "text"...}]
    object_arguments: bool = False    # True: tool-call arguments are passed as objects


_NEEDLE = "needle_value"


def _probe_tools() -> list[dict[str, Any]]:
    return [{"type": "function", "function": {
        "name": "tool1", "description": "Tool description",
        "parameters": {"type": "object", "properties": {"arg": {"type": "string"}},
                       "required": ["arg"]}}}]


def _try_render(template: Template, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None) -> str | None:
    """The output for these inputs, or None if the template fails on them; without tools,
    with tools when it fails without (some tool-use templates only render with tools)."""
    for attempt in ([tools] if tools else [None, _probe_tools()]):
        try:
            return template.render(messages=copy.deepcopy(messages),
                                   tools=attempt, add_generation_prompt=False,
                                   bos_token="", eos_token="")
        except Exception:  # a probe: any failure only means "not like this"
            continue
    return None


def _tool_history(arguments: Any) -> list[dict[str, Any]]:
    call = {"id": "call00001", "type": "function",
            "function": {"name": "tool1", "arguments": arguments}}
    return [{"role": "user", "content": "User message"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            {"role": "user", "content": "User message"}]


def _probe(template: Template) -> _Caps:
    marker = "STRING_MARKER"
    as_string = _try_render(template, [{"role": "user", "content": marker}])
    typed_only = False
    if as_string is None or marker not in as_string:
        as_parts = _try_render(template, [{"role": "user",
                                           "content": [{"type": "text", "text": marker}]}])
        typed_only = as_parts is not None and marker in as_parts

    def content(text: str) -> Any:
        return [{"type": "text", "text": text}] if typed_only else text

    system = _try_render(template, [{"role": "system", "content": content("SYSTEM_MARKER")},
                                    {"role": "user", "content": content("User message")}])
    with_strings = _try_render(template, _tool_history(json.dumps({"arg": _NEEDLE})),
                               _probe_tools())
    with_objects = _try_render(template, _tool_history({"arg": _NEEDLE}), _probe_tools())
    strings_ok = with_strings is not None and f'"arg": "{_NEEDLE}"' in with_strings
    objects_ok = with_objects is not None and _NEEDLE in with_objects
    return _Caps(system_role=system is not None and "SYSTEM_MARKER" in system,
                 typed_content_only=typed_only,
                 object_arguments=objects_ok and not strings_ok)


@dataclass(frozen=True)
class _Compiled:
    template: Template
    caps: _Caps


@functools.lru_cache(maxsize=32)
def _compile(source: str, probe: bool) -> _Compiled:
    """Parse a template once per source (raises jinja2.TemplateSyntaxError)."""
    template = _environment().from_string(source)
    return _Compiled(template, _probe(template) if probe else _Caps())


# --- messages --------------------------------------------------------------------------------

def _content_text(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content as a string, or its text parts (as given) when it has parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"Invalid 'content' type in {where}: expected string or array, "
                             f"got {type(content).__name__}")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA_PARTS:
            raise media_part_error(kind)
        if kind != "text" or not isinstance(part.get("text"), str):
            raise InvalidRequest(f"Unsupported content part in {where}: {json.dumps(part)}")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def _join_parts(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "\n".join(p["text"] for p in content)


def _tool_calls(calls: Any, where: str, object_arguments: bool) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise InvalidRequest(f"Invalid 'tool_calls' in {where}: expected an array")
    normalized = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"Missing tool call function name in {where}")
        if call.get("type", "function") != "function":
            raise InvalidRequest(f"Unsupported tool call type in {where}: {call.get('type')!r}")
        arguments = function.get("arguments", {})
        if object_arguments and isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                raise InvalidRequest(f"Failed to parse tool call arguments as JSON in {where}: "
                                     f"{exc}") from None
        elif not object_arguments and not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        normalized.append({**call, "type": "function",
                           "function": {**function, "arguments": arguments}})
    return normalized


def _normalize(messages: Any, caps: _Caps, map_developer: bool,
               allow_empty: bool = False) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not (messages or allow_empty):
        raise InvalidRequest("'messages' must be a non-empty array")
    normalized = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"Expected {where} to be an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequest(f"Missing 'role' in {where}")
        if role != "assistant" and "content" not in message:
            raise InvalidRequest("All non-assistant messages must contain 'content'")
        if role == "assistant" and "content" not in message and "tool_calls" not in message:
            raise InvalidRequest("Assistant message must contain either 'content' or "
                                 "'tool_calls'!")
        content = _content_text(message.get("content"), where)
        if not caps.typed_content_only:
            content = _join_parts(content)
        elif isinstance(content, str):
            content = [{"type": "text", "text": content}]
        out = {**message, "role": "system" if map_developer and role == "developer" else role,
               "content": content}
        if message.get("tool_calls"):
            out["tool_calls"] = _tool_calls(message["tool_calls"], where, caps.object_arguments)
        else:
            out.pop("tool_calls", None)
        normalized.append(out)
    if not caps.system_role and normalized and normalized[0]["role"] == "system":
        first = normalized.pop(0)
        if normalized:
            normalized[0] = {**normalized[0], "content": _merge(first["content"],
                                                                normalized[0]["content"])}
    return normalized


def _merge(system: Any, content: Any) -> Any:
    if isinstance(system, str) and isinstance(content, str):
        return f"{system}\n{content}"
    as_parts = [system] if isinstance(system, str) else system
    return [*([{"type": "text", "text": p} if isinstance(p, str) else p for p in as_parts]),
            *([{"type": "text", "text": content}] if isinstance(content, str) else content)]


def _prefill(messages: list[dict[str, Any]], continue_final_message: bool | None
             ) -> dict[str, Any] | None:
    """The final assistant message to continue, or None (llama-server's checks)."""
    if not messages:
        return None
    last = messages[-1]
    if continue_final_message is False or (continue_final_message is None
                                           and last["role"] != "assistant"):
        return None
    if last["role"] != "assistant":
        raise InvalidRequest("continue_final_message needs an assistant message at the end "
                             "of the list")
    if continue_final_message is None and len(messages) >= 2 and messages[-2]["role"] == \
            "assistant":
        raise InvalidRequest("Cannot have 2 or more assistant messages at the end of the list.")
    if last.get("tool_calls"):
        raise InvalidRequest("Cannot continue an assistant message that contains tool calls.")
    return last


# --- the template ----------------------------------------------------------------------------

class ChatTemplate:
    """One chat template, ready to render. `name`: the built-in name, or "model" (the GGUF's),
    "chat-template-file" / "chat-template" (a Jinja override); `source`: its Jinja text."""

    def __init__(self, name: str, source: str, *, bos_token: str = "", eos_token: str = "",
                 builtin: bool = False) -> None:
        self.name = name
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.builtin = builtin
        # built-ins take plain strings and need none of the probing; raises TemplateSyntaxError
        self._compiled = _compile(source, not builtin)

    @classmethod
    def builtin_named(cls, name: str, meta: ModelMeta | None = None) -> ChatTemplate:
        return cls(name, BUILTIN_TEMPLATES[name], bos_token=meta.bos_token if meta else "",
                   eos_token=meta.eos_token if meta else "", builtin=True)

    @classmethod
    def for_model(cls, settings: ApiSettings, meta: ModelMeta | None) -> ChatTemplate:
        """The template that applies to this model under these settings (see the module doc).
        Raises ServerError when the model's own template cannot be used."""
        name, source = _chosen_source(settings, meta)
        if source is None:
            return cls.builtin_named(name, meta)
        if not settings.jinja:
            builtin = detect_builtin_template(source)
            if builtin is None:
                raise ServerError("this custom template is not supported, try using --jinja")
            return cls.builtin_named(builtin, meta)
        try:
            return cls(name, source, bos_token=meta.bos_token if meta else "",
                       eos_token=meta.eos_token if meta else "")
        except TemplateError as exc:
            raise ServerError(f"failed to parse the {name} chat template: {exc}; use "
                              "--chat-template NAME or --chat-template-file") from None

    def render(self, messages: list[dict[str, Any]], *,
               tools: list[dict[str, Any]] | None = None, add_generation_prompt: bool = True,
               extra_context: Mapping[str, Any] | None = None,
               continue_final_message: bool | None = None, allow_empty: bool = False) -> str:
        """The prompt for `messages` (OpenAI chat messages as plain dicts; none at all only
        with `allow_empty`, as llama-server's Anthropic endpoint takes them).

        `tools`: OpenAI tool definitions, given to the template as `tools` (None when empty).
        `extra_context`: more template variables (chat_template_kwargs: enable_thinking,
        reasoning_effort, …; see :func:`template_kwargs`); they cannot replace the ones above.
        `continue_final_message` (llama-server's prefill): None = continue a final assistant
        message if there is one (`--prefill-assistant`, the default); False = never (pass it
        under `--no-prefill-assistant`); True = the last message must be one to continue.
        Continuing renders the messages before it with the generation prompt, then its content,
        unterminated (as llama.cpp does); `add_generation_prompt` is then ignored.
        A leading `bos_token` is removed: the worker adds BOS when the model wants one.
        Raises InvalidRequest for bad messages and template errors (`raise_exception`)."""
        caps = self._compiled.caps
        normalized = _normalize(messages, caps, map_developer="<|channel|>" not in self.source,
                                allow_empty=allow_empty)
        if "<|channel|>" in self.source:
            normalized = [_harmony_history(m) for m in normalized]
        prefill = _prefill(normalized, continue_final_message)
        if prefill is not None:
            normalized = normalized[:-1]
            add_generation_prompt = True
        now = datetime.now()
        # deep copies: templates may change what they are given (see _environment)
        context = copy.deepcopy({
            "date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y"),
            **(extra_context or {}),
            "messages": normalized, "tools": tools or None,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token, "eos_token": self.eos_token})
        try:
            text = self._compiled.template.render(context)
        except RENDER_ERRORS as exc:
            raise InvalidRequest(f"{exc}" if isinstance(exc, TemplateError)
                                 else f"Error rendering the chat template: {exc}") from None
        if self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if prefill is not None:
            text += _join_parts(prefill["content"])
        return text


def _harmony_history(message: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss templates read an assistant turn's reasoning as `thinking` (and its content
    not at all beside tool calls): llama.cpp's common/parsers/gpt-oss.cpp copies it so."""
    reasoning = message.get("reasoning_content")
    if not isinstance(reasoning, str):
        return message
    out = {**message, "thinking": reasoning}
    if message.get("tool_calls"):
        out.pop("content", None)
    return out


def _chosen_source(settings: ApiSettings, meta: ModelMeta | None) -> tuple[str, str | None]:
    """(name, Jinja source) of the template that applies; source None: the built-in `name`."""
    if settings.chat_template_file:
        try:
            return "chat-template-file", Path(settings.chat_template_file).read_text("utf-8")
        except OSError as exc:
            raise ServerError(f"cannot read --chat-template-file: {exc}") from None
    if settings.chat_template:
        if settings.chat_template in BUILTIN_TEMPLATES:
            return settings.chat_template, None
        return "chat-template", settings.chat_template
    if meta is not None and meta.chat_template:
        return "model", meta.chat_template
    return DEFAULT_TEMPLATE, None


def _looks_like_jinja(text: str) -> bool:
    return "{%" in text or "{{" in text


def validate_chat_template_setting(settings: ApiSettings) -> None:
    """Check the chat-template flags at start; raises ValueError with what to fix (an unknown
    `--chat-template` name: the list of the known ones)."""
    source: str | None = None
    if settings.chat_template_file:
        try:
            source = Path(settings.chat_template_file).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read --chat-template-file: {exc}") from None
    elif settings.chat_template and settings.chat_template not in BUILTIN_TEMPLATES:
        if not _looks_like_jinja(settings.chat_template):
            raise ValueError(f"unknown chat template {settings.chat_template!r} "
                             "(--chat-template); built-in templates: "
                             f"{', '.join(builtin_template_names())}")
        source = settings.chat_template
    if source is not None:
        if not settings.jinja and detect_builtin_template(source) is None:
            raise ValueError("the supplied chat template is not supported without --jinja; "
                             "use --jinja, or one of the built-in templates: "
                             f"{', '.join(builtin_template_names())}")
        if settings.jinja:
            try:
                _compile(source, True)
            except TemplateError as exc:
                raise ValueError(f"the supplied chat template is not valid Jinja: {exc}") from None
    _default_kwargs(settings)


def _default_kwargs(settings: ApiSettings) -> dict[str, Any]:
    """`--chat-template-kwargs`, `--reasoning`, `--reasoning-effort`, `--reasoning-preserve` as
    template variables (llama-server's default_template_kwargs); ValueError if malformed."""
    kwargs: dict[str, Any] = {}
    if settings.chat_template_kwargs:
        try:
            parsed = json.loads(settings.chat_template_kwargs)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--chat-template-kwargs is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError("--chat-template-kwargs must be a JSON object")
        kwargs.update(parsed)
    if settings.reasoning != "auto":
        kwargs["enable_thinking"] = settings.reasoning == "on"
    if settings.reasoning_effort != "default":
        kwargs["reasoning_effort"] = settings.reasoning_effort
    kwargs.setdefault("preserve_reasoning", settings.reasoning_preserve)
    return kwargs


def template_kwargs(settings: ApiSettings, request_kwargs: Mapping[str, Any] | None = None,
                    reasoning_effort: str | None = None) -> dict[str, Any]:
    """The template variables of a request (`extra_context` for render): the server's defaults,
    then the request's `chat_template_kwargs`, then its `reasoning_effort` ("none" turns
    thinking off), as llama-server merges them. `enable_thinking` defaults to "not --reasoning
    off". Raises InvalidRequest for an `enable_thinking` that is not a boolean."""
    kwargs = {"enable_thinking": settings.reasoning != "off", **_default_kwargs(settings)}
    kwargs.update(request_kwargs or {})
    if not isinstance(kwargs["enable_thinking"], bool):
        raise InvalidRequest('invalid type for "enable_thinking" (expected boolean, got '
                             f'{type(kwargs["enable_thinking"]).__name__})')
    if reasoning_effort == "none":
        kwargs["enable_thinking"] = False
        kwargs.pop("reasoning_effort", None)
    elif reasoning_effort:
        kwargs["reasoning_effort"] = reasoning_effort
    return kwargs
