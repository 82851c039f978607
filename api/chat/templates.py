"""Chat templates: OpenAI-style messages → the prompt text a model expects.

Templates are Jinja, rendered in a sandbox the way Hugging Face transformers and llama.cpp render
them (api/chat/jinja_env.py). Which template applies (:meth:`ChatTemplate.for_model`):
`--chat-template-file` > `--chat-template` (a built-in name, or a Jinja string) > the model's own
template (GGUF metadata, published by its workers) > chatml.

Messages are normalized before rendering as llama-server does (api/chat/template_messages.py).
A final assistant message is continued (prefill): see :meth:`ChatTemplate.render`.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from api.chat.builtin import BUILTIN_TEMPLATES, builtin_template_names, detect_builtin_template
from api.chat.jinja_env import RENDER_ERRORS, compile_template
from api.chat.reasoning_tags import prompt_opens_thinking, reasoning_tags
from api.chat.template_messages import (
    continuation_mode,
    harmony_history,
    join_parts,
    message_to_continue,
    normalize_messages,
)
from api.settings import ApiSettings
from scheduler.contract.errors import InvalidRequest, LlamaqError, ServerError
from scheduler.registry import ModelMeta

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "chatml"

__all__ = ["ChatTemplate", "builtin_template_names", "template_kwargs",
           "validate_chat_template_setting"]


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
        self._compiled = compile_template(source, not builtin)

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
               continue_final_message: bool | str | None = None, allow_empty: bool = False) -> str:
        """The prompt (see :meth:`render_continued`)."""
        prompt, _ = self.render_continued(
            messages, tools=tools, add_generation_prompt=add_generation_prompt,
            extra_context=extra_context, continue_final_message=continue_final_message,
            allow_empty=allow_empty)
        return prompt

    def render_direct(self, messages: list[dict[str, Any]], *,
                      tools: list[dict[str, Any]] | None = None,
                      add_generation_prompt: bool = False,
                      extra_context: Mapping[str, Any] | None = None) -> str:
        """The template applied as llama.cpp's `common_chat_template_direct_apply` applies it
        (its auto-parser's renders): the messages as given, tool-call arguments as they are,
        string content as parts only where the template takes nothing else; no system merge, no
        prefill. Raises what the template raises."""
        typed = self._compiled.caps.typed_content_only
        messages = [{**m, "content": [{"type": "text", "text": m["content"]}]}
                    if typed and isinstance(m.get("content"), str) else m for m in messages]
        context: dict[str, Any] = {**(extra_context or {}), "messages": messages,
                                   "bos_token": self.bos_token, "eos_token": self.eos_token}
        if tools:
            context["tools"] = tools
        if add_generation_prompt:
            context["add_generation_prompt"] = True
        return self._compiled.template.render(copy.deepcopy(context))

    def render_continued(
            self, messages: list[dict[str, Any]], *,
            tools: list[dict[str, Any]] | None = None, add_generation_prompt: bool = True,
            extra_context: Mapping[str, Any] | None = None,
            continue_final_message: bool | str | None = None,
            allow_empty: bool = False,
            thinking_tags: tuple[str, str] | None = None) -> tuple[str, str]:
        """The prompt for `messages` (OpenAI chat messages as plain dicts; none at all only
        with `allow_empty`, as llama-server's Anthropic endpoint takes them).

        `tools`: OpenAI tool definitions, given to the template as `tools` (undefined when none).
        `extra_context`: more template variables (chat_template_kwargs: enable_thinking,
        reasoning_effort, …; see :func:`template_kwargs`); they cannot replace the ones above.
        `continue_final_message` (llama-server's prefill): None = continue a final assistant
        message if there is one (`--prefill-assistant`, the default); False = never (pass it
        under `--no-prefill-assistant`); True = the last message must be one to continue;
        "content" / "reasoning_content": so, continuing that part of it (its reasoning closed
        before its content, or left open and its content not written).
        Continuing renders the messages before it with the generation prompt, then its content,
        unterminated (as llama.cpp does); `add_generation_prompt` is then ignored. A continued
        message's reasoning is written in the template's thinking tags first, empty ones too, as
        llama.cpp writes them (left open when the message has no content: its reasoning is
        continued). Returns (the prompt, what the
        continued message added to it: the answer's parser reads it as the answer's start, as
        llama-server parses its generation prompt with the answer). `thinking_tags`: the tags
        a continued message's reasoning is written in, as llama.cpp's auto-parser found them
        in the template (its whitespace included); None: the template's (reasoning_tags.py).
        A leading `bos_token` is removed: the worker adds BOS when the model wants one.
        Raises InvalidRequest for bad messages and template errors (`raise_exception`)."""
        caps = self._compiled.caps
        normalized = normalize_messages(messages, caps,
                                        map_developer="<|channel|>" not in self.source,
                                        allow_empty=allow_empty)
        if "<|channel|>" in self.source:
            normalized = [harmony_history(m) for m in normalized]
        mode = continuation_mode(continue_final_message)
        prefill = message_to_continue(normalized, mode)
        if prefill is not None:
            normalized = normalized[:-1]
            add_generation_prompt = True
        now = datetime.now()
        # deep copies: templates may change what they are given (api/chat/jinja_env.py environment)
        context = copy.deepcopy({
            "date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y"),
            **(extra_context or {}),
            "messages": normalized, "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token, "eos_token": self.eos_token})
        if tools:  # without tools, `tools` is undefined, as llama.cpp leaves it
            context["tools"] = copy.deepcopy(tools)
        try:
            text = self._compiled.template.render(context)
        except RENDER_ERRORS as exc:
            raise InvalidRequest(f"{exc}" if isinstance(exc, TemplateError)
                                 else f"Error rendering the chat template: {exc}") from None
        if self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        if prefill is None:
            return text, ""
        added = join_parts(prefill["content"])
        reasoning = prefill.get("reasoning_content")
        if "<|channel|>" in self.source:  # gpt-oss, as llama.cpp's parsers/gpt-oss.cpp continues
            reasoning = reasoning if isinstance(reasoning, str) else ""
            content = mode == "content" or (mode is not False and mode != "reasoning_content"
                                            and bool(added or not reasoning))
            added = "<|channel|>analysis<|message|>" + reasoning + (
                "<|end|><|start|>assistant<|channel|>final<|message|>" + added if content else "")
            return text + added, added
        start, end = thinking_tags or reasoning_tags(self.source)
        # (Kimi K2's and LFM2's parsers think in <think> tags even where the template shows none)
        thinks = thinking_tags is not None or start.strip() in self.source or any(
            marker in self.source for marker in (
            "<|tool_calls_section_begin|>", "<|tool_list_start|>", "List of tools: ["))
        if thinks:
            # as llama.cpp continues a message under a template that thinks: the reasoning in
            # the thinking tags, empty ones too, closed before the content (left open when the
            # message has no content); a template that does not think has it left out
            reasoning = reasoning if isinstance(reasoning, str) else ""
            opened = "" if prompt_opens_thinking(text, self.source) else start
            if mode == "content":  # the reasoning closed, the content continued
                added = opened + reasoning + end + added
            elif mode == "reasoning_content":  # the reasoning continued
                added = opened + reasoning
            elif reasoning or added:
                added = opened + reasoning + (end + added if added else "")
        return text + added, added


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


CHATML_SOURCE = ("{%- for message in messages -%}\n"
                 "  {{- '<|im_start|>' + message.role + '\n' + message.content + "
                 "'<|im_end|>\n' -}}\n"
                 "{%- endfor -%}\n"
                 "{%- if add_generation_prompt -%}\n"
                 "  {{- '<|im_start|>assistant\n' -}}\n"
                 "{%- endif -%}")
"""llama.cpp's chatml fallback (common/chat.cpp CHATML_TEMPLATE_SRC), as /props shows it."""


def reported_source(settings: ApiSettings, meta: ModelMeta | None) -> str:
    """The template text /props shows as `chat_template`, as llama-server's
    (`common_chat_templates_source`): --chat-template-file's text, --chat-template's value, else
    the model's own; llama.cpp's chatml source for none or `chatml`; "" when the file does not
    read."""
    try:
        name, source = _chosen_source(settings, meta)
    except LlamaqError:
        return ""
    text = name if source is None else source
    return CHATML_SOURCE if text in ("", DEFAULT_TEMPLATE) else text


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
                compile_template(source, True)
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
