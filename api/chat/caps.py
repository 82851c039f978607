"""What a chat template can take: the nine capabilities /props reports as `chat_template_caps`.

The probes are llama.cpp's (common/jinja/caps.cpp `caps_get`): the template is rendered with
made-up conversations and what it *read* decides each capability. llama.cpp's Jinja engine
counts reads on every value; here the conversations are built from `_Tracked` dicts that record
the keys a template reads (by subscript, attribute, `.get`, or wholesale by iterating, `items()`
or `tojson`). Defaults when a probe cannot tell are llama.cpp's (caps.h).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from typing import Any

from jinja2 import Template, meta

from api.chat.jinja_env import environment

CAP_NAMES = ("supports_string_content", "supports_typed_content", "supports_tools",
             "supports_tool_calls", "supports_parallel_tool_calls", "supports_system_role",
             "supports_preserve_reasoning", "supports_reasoning_effort",
             "supports_object_arguments")
_MARKER = "STRING_MARKER"
_REASONING = "<REASONING_CONTENT_PLACEHOLDER>"


class _Tracked(dict[str, Any]):
    """A dict that remembers which keys were read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.reads.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.reads.add(key)
        return super().get(key, default)

    def items(self) -> Any:
        self.reads.update(self.keys())
        return super().items()

    def values(self) -> Any:
        self.reads.update(self.keys())
        return super().values()

    def __iter__(self) -> Iterator[str]:
        self.reads.update(self.keys())
        return super().__iter__()

    def used(self, key: str) -> bool:
        return key in self.reads


class _Ops(str):
    """A string that remembers what a template did with it (llama.cpp's value stats `ops`):
    indexed by a number, iterated, passed to `selectattr`, tested `is string`."""

    def __new__(cls, text: str) -> _Ops:
        made = super().__new__(cls, text)
        made.ops = set()
        return made

    ops: set[str]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int):
            self.ops.add("array_access")
        return super().__getitem__(key)

    def __iter__(self) -> Iterator[str]:
        self.ops.add("array_access")
        return super().__iter__()


class _OpsList(list[Any]):
    """The same for a list."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __getitem__(self, key: Any) -> Any:
        self.ops.add("array_access")
        return super().__getitem__(key)

    def __iter__(self) -> Iterator[Any]:
        self.ops.add("array_access")
        return super().__iter__()


def _noted(op: str, function: Any) -> Callable[..., Any]:
    """`function` (a Jinja test or filter), noting `op` on the value it is given."""
    first = 1 if getattr(function, "jinja_pass_arg", None) else 0  # after the context

    @functools.wraps(function)
    def noting(*args: Any, **kwargs: Any) -> Any:
        if len(args) > first and isinstance(args[first], _Ops | _OpsList):
            args[first].ops.add(op)
        return function(*args, **kwargs)
    return noting


def _touch(value: Any) -> Any:
    """Mark everything in `value` read, as `tojson` and `string` read it in llama.cpp's engine
    (which does not count that as indexing a list)."""
    if isinstance(value, _Tracked):
        value.reads.update(value.keys())
    if isinstance(value, dict):
        for item in dict.values(value):
            _touch(item)
    elif isinstance(value, list):
        for item in list.__iter__(value):
            _touch(item)
    return list(list.__iter__(value)) if isinstance(value, _OpsList) else value


def _probing_environment() -> Any:
    """The chat sandbox, its `is string`, `selectattr` and `tojson` noting what they read."""
    env = environment()
    env.tests = {**env.tests, "string": _noted("test_is_string", env.tests["string"])}
    tojson, string = env.filters["tojson"], env.filters["string"]
    env.filters = {**env.filters, "selectattr": _noted("selectattr", env.filters["selectattr"]),
                   "tojson": lambda value, *a, **k: tojson(_touch(value), *a, **k),
                   "string": lambda value: string(_touch(value))}
    return env


def _track(value: Any) -> Any:
    if isinstance(value, _Ops | _OpsList):
        return value
    if isinstance(value, dict):
        return _Tracked({k: _track(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_track(v) for v in value]
    return value


def _render(template: Template, messages: list[Any], tools: list[Any] | None = None,
            **extra: Any) -> str | None:
    """The template's output, or None when it fails on these inputs."""
    try:
        return template.render(messages=messages, tools=tools or [], bos_token="",
                               eos_token="", add_generation_prompt=True, **extra)
    except Exception:  # a probe: failing only means "not like this"
        return None


def _tools() -> list[Any]:
    return _track([{"name": "tool", "type": "function", "function": {
        "name": "tool1", "description": "Tool description",
        "parameters": {"type": "object",
                       "properties": {"arg": {"type": "string", "description": "Arg description"}},
                       "required": ["arg"]}}}])


def _tool_history(arguments: Callable[[], Any], n_calls: int = 1) -> list[Any]:
    calls = [{"id": f"call0000{i + 1}", "type": "function",
              "function": {"name": "tool1", "arguments": arguments()}} for i in range(n_calls)]
    return _track([
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        {"role": "user", "content": "User message"},
    ])


def _reasoning_context(preserve: bool) -> dict[str, Any]:
    return {"enable_thinking": True, "preserve_thinking": preserve,
            "clear_thinking": not preserve, "truncate_history_thinking": not preserve,
            "drop_thinking": not preserve}


@functools.lru_cache(maxsize=16)
def chat_template_caps(source: str) -> dict[str, bool]:
    """The nine capabilities of a Jinja chat template (all llama.cpp's defaults for a template
    that does not parse)."""
    caps = {"supports_string_content": True, "supports_typed_content": False,
            "supports_tools": True, "supports_tool_calls": True,
            "supports_parallel_tool_calls": True, "supports_system_role": True,
            "supports_preserve_reasoning": False, "supports_reasoning_effort": False,
            "supports_object_arguments": False}
    env = _probing_environment()
    try:
        template = env.from_string(source)
        variables = meta.find_undeclared_variables(env.parse(source))
    except Exception:  # reported as llama.cpp reports a template it cannot analyse
        return caps

    # content: a string, and typed parts where the string is used as a list (or, where the
    # template asks whether it is a string, an empty list is)
    content = _Ops(_MARKER)
    output = _render(template, _track([{"role": "user", "content": content}]))
    as_list = bool(content.ops & {"selectattr", "array_access"})
    caps["supports_typed_content"] = as_list
    if output is None or (as_list and _MARKER not in output):
        caps["supports_string_content"] = False
    if "test_is_string" in content.ops:
        parts = _OpsList()
        typed = _render(template, _track([{"role": "user", "content": parts}]))
        caps["supports_typed_content"] |= typed is not None and bool(
            parts.ops & {"selectattr", "array_access"})

    # the system role
    messages = _track([{"role": "system", "content": "System message"},
                       {"role": "user", "content": "User message"}])
    output = _render(template, messages)
    caps["supports_system_role"] = messages[0].used("content") and (
        output is None or "System message" in output)

    # tools, one call with object arguments, else with string arguments
    for object_args in (True, False):
        tools = _tools()
        messages = _tool_history(lambda o=object_args: {"arg": "value"} if o  # type: ignore[misc]
                                 else json.dumps({"arg": "value"}))
        if _render(template, messages, tools) is None:
            if not object_args:
                caps["supports_tools"] = caps["supports_tool_calls"] = False
            continue
        caps["supports_tools"] = tools[0]["function"].used("name")
        caps["supports_tool_calls"] = messages[1].used("tool_calls")
        if object_args and caps["supports_tool_calls"]:
            arguments = messages[1]["tool_calls"][0]["function"]["arguments"]
            caps["supports_object_arguments"] = arguments.used("arg")
        if caps["supports_object_arguments"]:
            break

    # parallel calls
    object_args = caps["supports_object_arguments"]
    messages = _tool_history(lambda: {"arg": "value"} if object_args
                             else json.dumps({"arg": "value"}), n_calls=2)
    if _render(template, messages, _tools()) is None:
        caps["supports_parallel_tool_calls"] = False
    else:
        caps["supports_parallel_tool_calls"] = messages[1]["tool_calls"][1].used("function")

    # reasoning kept in the history
    messages = _track([
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": _REASONING},
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message",
         "reasoning_content": "Reasoning content"},
        {"role": "user", "content": "User message"},
    ])
    output = _render(template, messages, **_reasoning_context(True))
    caps["supports_preserve_reasoning"] = output is not None and _REASONING in output

    # reasoning effort levels: the template reads the variable
    caps["supports_reasoning_effort"] = bool({"reasoning_effort", "reasoning_strength"}
                                             & variables)
    return caps
