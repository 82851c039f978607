"""Tool calls streamed while they are written, for the families whose calls are not JSON in
`<tool_call>`: LFM2's pythonic calls, Command-R7B's / Cohere2-MoE's actions, Kimi-K2's,
GLM's (GLM 4.x, Spark, Ling 3), DeepSeek V3.2/V4's DSML and MiniCPM 5's calls send their id
(where the model writes one) and name before the call ends, and their arguments in pieces;
the stream adds up to the whole answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.chat.message import ChatDelta
from api.chat.prepare import ChatRequest, prepare_chat
from api.settings import ApiSettings
from scheduler.registry import ModelMeta
from tests.chat_cases import assemble
from tests.paths import DATA

TOOLS = [{"type": "function", "function": {
    "name": "special_function", "description": "I'm special",
    "parameters": {"type": "object", "properties": {"arg1": {"type": "integer"}},
                   "required": ["arg1"]}}}]
R7B_ACTION = ('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "special_function", '
              '"parameters": {"arg1": 1}}\n]<|END_ACTION|>')
KIMI_CALL = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0"
             '<|tool_call_argument_begin|>{"arg1": 1}<|tool_call_end|><|tool_calls_section_end|>')
LFM2_CALL = "<|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|>"
GLM_CALL = ("<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n"
            "</tool_call>")
DSML_CALL = ('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="special_function">\n'
             '<｜DSML｜parameter name="arg1" string="false">1</｜DSML｜parameter>\n'
             '</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
CPM_CALL = '<function name="special_function"><param name="arg1">1</param></function>'


def _deltas(template: str, text: str) -> tuple[list[list[ChatDelta]], Any]:
    source = (DATA / "templates" / f"{template}.jinja").read_text("utf-8")
    meta = ModelMeta(vocab_type=2, n_vocab=1000, n_ctx_train=4096, n_embd=64, n_params=1,
                     size=1, chat_template=source, bos_token="<s>", eos_token="</s>")
    request = ChatRequest(messages=[{"role": "user", "content": "hi"}], tools=TOOLS,
                          tool_choice=None, reasoning_format="none")
    chat = prepare_chat(ApiSettings.from_args(["--jinja"], environ={}), meta, request)
    parser = chat.parser()
    steps = [parser.feed(ch) for ch in text]
    steps.append(parser.flush())
    return steps, chat.parse(text)


@pytest.mark.parametrize(("template", "text", "end", "ident", "pieces"), [
    ("LFM2-8B-A1B", LFM2_CALL, "<|tool_call_end|>", None, 2),  # `{` with the name, `"arg1":1}`
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", R7B_ACTION, "<|END_ACTION|>", "0", 2),
    ("Cohere2MoE", R7B_ACTION, "<|END_ACTION|>", "0", 2),
    ("Kimi-K2-Instruct", KIMI_CALL, "<|tool_call_end|>", "functions.special_function:0", 2),
    ("GLM-4.6", GLM_CALL, "</tool_call>", None, 2),  # `{` with the name, `"arg1":1` …, `}`
    ("GLM-4.7-Flash", GLM_CALL.replace("\n", ""), "</tool_call>", None, 2),
    ("inclusionai-ling-3.0-flash", GLM_CALL, "</tool_call>", None, 2),
    ("deepseek-ai-DeepSeek-V4-Flash-0731", DSML_CALL, "</｜DSML｜tool_calls>", None, 2),
    ("openbmb-MiniCPM5-1B", CPM_CALL, "</function>", None, 2),
])
def test_name_first_then_arguments(template: str, text: str, end: str, ident: str | None,
                                   pieces: int) -> None:
    steps, whole = _deltas(template, text)
    named = next(i for i, step in enumerate(steps) if any(d.tool_calls for d in step))
    assert named < text.index(end), "the name is sent before the call ends"
    first = next(tc for d in steps[named] for tc in d.tool_calls)
    assert first.name == "special_function"
    if ident is not None:
        assert first.id == ident
    argument_pieces = [tc.arguments for step in steps for d in step for tc in d.tool_calls
                       if tc.arguments]
    assert len(argument_pieces) >= pieces
    streamed = assemble([d for step in steps for d in step])
    assert [(c.name, json.loads(c.arguments)) for c in streamed.tool_calls] == \
        [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == \
        [("special_function", {"arg1": 1})]
    assert streamed.tool_calls[0].id == whole.tool_calls[0].id or ident is None
