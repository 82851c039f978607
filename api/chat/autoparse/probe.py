"""What llama.cpp's analyser renders a template with (common/chat-diff-analyzer.cpp): needles
no template writes by itself, two tools, messages with and without reasoning and calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.chat.autoparse.diff import DiffSplit, diff_split
from api.chat.templates import ChatTemplate

USER_MSG = "U_USER_MSG Hello END_U"
USER_MSG_TWO = "V_USER_MSG Hello END_V"
ASSISTANT_MSG = "A_ASST_MSG I can help END_A"
THINKING = "REASON_PART I am thinking END_R"
FUN_FIRST = "FFF_FIRST_FUN_F"
FUN_SECOND = "SSS_SECOND_FUN_S"
ARG_FIRST = "AA_ARG_FST_AA"
ARG_SECOND = "BB_ARG_SND_BB"
CALL_ID_001 = "call00001"
CALL_ID_002 = "call00002"
CALL_ID_999 = "call99999"

_PARAMS = {"type": "object",
           "properties": {ARG_FIRST: {"type": "string", "description": "First argument"},
                          ARG_SECOND: {"type": "string", "description": "Second argument"}},
           "required": []}
TOOLS = [{"type": "function", "function": {"name": name, "description": description,
                                           "parameters": _PARAMS}}
         for name, description in ((FUN_FIRST, "Test function foo"),
                                   (FUN_SECOND, "Test function bar"))]
USER = {"role": "user", "content": USER_MSG}


def tool_call(name: str, arguments: dict[str, Any], ident: str = CALL_ID_001) -> dict[str, Any]:
    return {"id": ident, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def assistant(content: str | None = ASSISTANT_MSG, reasoning: str | None = None,
              calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls is not None:
        message["tool_calls"] = calls
    return message


@dataclass
class Compared:
    diff: DiffSplit
    a: str
    b: str


class Renderer:
    """Renders one template as llama.cpp's analyser does (`apply_template`): None on failure."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._template = ChatTemplate("auto", source)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               generation_prompt: bool = False, thinking: bool = True) -> str | None:
        try:
            return self._template.render_direct(
                messages, tools=tools, add_generation_prompt=generation_prompt,
                extra_context={"enable_thinking": thinking})
        except Exception:  # a probe: a template that fails here is only not analysed so
            return None

    def compare(self, a: list[dict[str, Any]], b: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None, generation_prompt: bool = False,
                thinking_a: bool = True, thinking_b: bool = True) -> Compared | None:
        out_a = self.render(a, tools, generation_prompt, thinking_a)
        out_b = self.render(b, tools, generation_prompt, thinking_b)
        if out_a is None or out_b is None:
            return None
        return Compared(diff_split(out_a, out_b), out_a, out_b)


