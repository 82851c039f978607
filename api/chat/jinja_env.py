"""The sandboxed Jinja environment chat templates render in, as Hugging Face transformers and
llama.cpp render them (`trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`,
`strftime_now`, a `tojson` that does not HTML-escape, `{% generation %}`), and what a template
can take (llama.cpp's template caps, probed by rendering it). api/chat/templates.py renders
with it."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2 import Template, TemplateError, Undefined, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import SandboxedEnvironment

RENDER_ERRORS = (TemplateError, TypeError, ValueError, LookupError, AttributeError,
                 ArithmeticError)


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


_TEXT_AS_STRING = (dict, list, tuple, int)  # bool is an int


class _ChatSandbox(SandboxedEnvironment):
    """`+` of a string and null or undefined is the string, as llama.cpp's engine adds them
    (Firefunction v2's template adds an undefined `functions`); of a string and an object, a
    list, a number or a boolean, the string and that value as text, as llama.cpp's engine
    writes it (Python's way: Functionary v3.2's template adds a call's object arguments)."""

    intercepted_binops = frozenset({"+"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "+":
            if isinstance(left, str) and (right is None or isinstance(right, Undefined)):
                return left
            if isinstance(right, str) and (left is None or isinstance(left, Undefined)):
                return right
            if isinstance(left, str) and isinstance(right, _TEXT_AS_STRING):
                return left + str(right)
            if isinstance(right, str) and isinstance(left, _TEXT_AS_STRING):
                return str(left) + right
        return super().call_binop(context, operator, left, right)


def environment() -> SandboxedEnvironment:
    """The sandbox. Not the immutable one transformers uses: llama.cpp's engine lets templates
    append to their own lists (Kimi K2's does), and what they get is a deep copy anyway."""
    env = _ChatSandbox(trim_blocks=True, lstrip_blocks=True,
                               extensions=["jinja2.ext.loopcontrols", _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# --- what a template can take (llama.cpp's template "caps", probed by rendering) ---------------

@dataclass(frozen=True)
class TemplateCaps:
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


def _probe(template: Template) -> TemplateCaps:
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
    return TemplateCaps(system_role=system is not None and "SYSTEM_MARKER" in system,
                 typed_content_only=typed_only,
                 object_arguments=objects_ok and not strings_ok)


@dataclass(frozen=True)
class CompiledTemplate:
    template: Template
    caps: TemplateCaps


@functools.lru_cache(maxsize=32)
def compile_template(source: str, probe: bool) -> CompiledTemplate:
    """Parse a template once per source (raises jinja2.TemplateSyntaxError)."""
    template = environment().from_string(source)
    return CompiledTemplate(template, _probe(template) if probe else TemplateCaps())
