"""chat_template_caps: llama.cpp's nine capability probes (common/jinja/caps.cpp) on templates
whose answers are known."""

from __future__ import annotations

import json

import pytest

from api.chat.caps import CAP_NAMES, chat_template_caps
from tests.paths import DATA
from tests.tiny_gguf import CHAT_TEMPLATE as STRING_ONLY

LLAMA_CPP_CAPS = json.loads((DATA / "llama_cpp_template_caps.json").read_text("utf-8"))
"""llama.cpp's own caps of each template in tests/data/templates (bench/malformed_calls.py)."""

GEMMA_LIKE = (
    "{%- if messages[0]['role'] == 'system' -%}{%- set first = messages[0]['content'] -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first = '' -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}<start_of_turn>{{ message['role'] }}\n"
    "{%- if loop.first %}{{ first }}{% endif -%}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}<end_of_turn>\n{%- endfor -%}"
)
TOOLS = (
    "{%- if tools %}{{ tools | tojson }}{% endif -%}"
    "{%- for m in messages -%}<|{{ m.role }}|>{{ m.content }}"
    "{%- for call in m.tool_calls or [] -%}"
    "{{ call.function.name }}({% for k, v in call.function.arguments.items() %}{{ k }}={{ v }}"
    "{% endfor %})"
    "{%- endfor -%}"
    "{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif -%}"
    "{%- endfor -%}{%- if reasoning_effort %}effort={{ reasoning_effort }}{% endif -%}"
)
NO_SYSTEM = (
    "{%- for m in messages -%}{%- if m['role'] == 'system' -%}"
    "{{ raise_exception('System role not supported') }}{%- endif -%}"
    "{{ m['role'] }}: {{ m['content'] }}\n{%- endfor -%}"
)
TYPED_ONLY = (
    "{%- for m in messages -%}{{ m.role }}:"
    "{%- for part in m.content | selectattr('type', 'equalto', 'text') -%}{{ part.text }}"
    "{%- endfor %}\n{%- endfor -%}"
)


def test_reports_all_nine() -> None:
    assert set(chat_template_caps(STRING_ONLY)) == set(CAP_NAMES)


def test_a_template_that_reads_only_strings() -> None:
    caps = chat_template_caps(STRING_ONLY)
    assert caps["supports_string_content"] is True
    assert caps["supports_typed_content"] is False
    assert caps["supports_system_role"] is True
    assert caps["supports_tools"] is False  # renders, but never reads the tools
    assert caps["supports_tool_calls"] is False
    assert caps["supports_parallel_tool_calls"] is False
    assert caps["supports_reasoning_effort"] is False
    assert caps["supports_preserve_reasoning"] is False


def test_string_and_typed_content() -> None:
    caps = chat_template_caps(GEMMA_LIKE)
    assert caps["supports_string_content"] is True
    assert caps["supports_typed_content"] is True
    assert caps["supports_system_role"] is True


def test_typed_content_only() -> None:
    caps = chat_template_caps(TYPED_ONLY)
    assert caps["supports_string_content"] is False
    assert caps["supports_typed_content"] is True


def test_no_system_role() -> None:
    assert chat_template_caps(NO_SYSTEM)["supports_system_role"] is False


def test_tools_object_arguments_parallel_calls_and_reasoning() -> None:
    caps = chat_template_caps(TOOLS)
    assert caps["supports_tools"] is True
    assert caps["supports_tool_calls"] is True
    assert caps["supports_object_arguments"] is True
    assert caps["supports_parallel_tool_calls"] is True
    assert caps["supports_preserve_reasoning"] is True
    assert caps["supports_reasoning_effort"] is True


@pytest.mark.parametrize("name", sorted(LLAMA_CPP_CAPS))
def test_caps_equal_llama_cpps(name: str) -> None:
    """/props `chat_template_caps` as llama-server gives them: `typed content` where the string
    content is indexed, iterated or passed to `selectattr` (or, for a template that asks
    `is string`, an empty list is), `tojson`/`string` reading all they are given."""
    source = (DATA / "templates" / name).read_text("utf-8")
    assert chat_template_caps(source) == LLAMA_CPP_CAPS[name]
