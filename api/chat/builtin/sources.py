"""The built-in chat templates (`--chat-template NAME`) as Jinja sources.

Each one reproduces what llama.cpp's `llm_chat_apply_template` (src/llama-chat.cpp) writes for
the same messages, byte for byte, so that `--chat-template llama3` means here what it means to
llama-server. Most are "one prefix and one suffix per role" and are built by :func:`_turns`;
the ones with state (a pending system prompt, an open [INST] turn) are written out by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Turn:
    """How one role is written: `before` + content + `after`. In `before`, `{role}` stands for
    the message's role and `{ROLE}` for it upper-cased; `trim` strips the content."""

    before: str
    after: str = ""
    trim: bool = False


def _lit(text: str) -> str:
    """A Jinja string literal."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"


def _expr(text: str) -> str:
    """A Jinja expression for `text` with its {role}/{ROLE} placeholders filled in."""
    parts: list[str] = []
    rest = text
    while rest:
        cuts = [(rest.find(mark), mark) for mark in ("{role}", "{ROLE}") if mark in rest]
        if not cuts:
            parts.append(_lit(rest))
            break
        at, mark = min(cuts)
        if at:
            parts.append(_lit(rest[:at]))
        parts.append("message.role" if mark == "{role}" else "(message.role | upper)")
        rest = rest[at + len(mark):]
    return " + ".join(parts) or "''"


def _emit(turn: Turn) -> str:
    content = "(message.content | trim)" if turn.trim else "message.content"
    pieces = [_expr(turn.before)] if turn.before else []
    pieces.append(content)
    if turn.after:
        pieces.append(_lit(turn.after))
    return "{{- " + " + ".join(pieces) + " -}}"


def _turns(roles: dict[str, Turn], *, generation: str = "", start: str = "") -> str:
    """A template that writes each message by its role ("*": any other role; a role that is
    not listed and no "*": the message is left out), then `generation` when asked for."""
    lines = [f"{{{{- {_lit(start)} -}}}}"] if start else []
    lines.append("{%- for message in messages -%}")
    named = [(role, turn) for role, turn in roles.items() if role != "*"]
    for index, (role, turn) in enumerate(named):
        keyword = "if" if index == 0 else "elif"
        lines.append(f"{{%- {keyword} message.role == {_lit(role)} -%}}")
        lines.append("  " + _emit(turn))
    if "*" in roles:
        if named:
            lines.append("{%- else -%}")
        lines.append("  " + _emit(roles["*"]))
    if named:
        lines.append("{%- endif -%}")
    lines.append("{%- endfor -%}")
    if generation:
        lines.append("{%- if add_generation_prompt -%}")
        lines.append(f"  {{{{- {_lit(generation)} -}}}}")
        lines.append("{%- endif -%}")
    return "\n".join(lines)


def _llama2(*, system: bool, bos_inside: bool = False, strip: bool = False) -> str:
    content = "(message.content | trim)" if strip else "message.content"
    system_line = ("'<<SYS>>\\n' + content + '\\n<</SYS>>\\n\\n'" if system
                   else "content + '\\n'")
    reopen = "'<s>[INST] '" if bos_inside else "'[INST] '"
    return f"""{{%- set ns = namespace(inside=true) -%}}
{{{{- '[INST] ' -}}}}
{{%- for message in messages -%}}
{{%- set content = {content} -%}}
{{%- if not ns.inside -%}}
  {{%- set ns.inside = true -%}}
  {{{{- {reopen} -}}}}
{{%- endif -%}}
{{%- if message.role == 'system' -%}}
  {{{{- {system_line} -}}}}
{{%- elif message.role == 'user' -%}}
  {{{{- content + ' [/INST]' -}}}}
{{%- else -%}}
  {{{{- content + '</s>' -}}}}
  {{%- set ns.inside = false -%}}
{{%- endif -%}}
{{%- endfor -%}}"""


def _mistral(*, lead: str, trail: str, trim_assistant: bool) -> str:
    answer = "(message.content | trim)" if trim_assistant else "message.content"
    return f"""{{%- set ns = namespace(inside=false) -%}}
{{%- for message in messages -%}}
{{%- if not ns.inside -%}}
  {{{{- {_lit(lead + "[INST]" + trail)} -}}}}
  {{%- set ns.inside = true -%}}
{{%- endif -%}}
{{%- if message.role == 'system' -%}}
  {{{{- message.content + '\\n\\n' -}}}}
{{%- elif message.role == 'user' -%}}
  {{{{- message.content + {_lit(lead + "[/INST]")} -}}}}
{{%- else -%}}
  {{{{- {_lit(trail)} + {answer} + '</s>' -}}}}
  {{%- set ns.inside = false -%}}
{{%- endif -%}}
{{%- endfor -%}}"""


def _mistral_v7(space: str) -> str:
    return _turns({"system": Turn(f"[SYSTEM_PROMPT]{space}", "[/SYSTEM_PROMPT]"),
                   "user": Turn(f"[INST]{space}", "[/INST]"),
                   "*": Turn(space, "</s>")})


def _vicuna(*, orca: bool) -> str:
    system = Turn("SYSTEM: ", "\n") if orca else Turn("", "\n\n")
    return _turns({"system": system, "user": Turn("USER: ", "\n"),
                   "assistant": Turn("ASSISTANT: ", "</s>\n")}, generation="ASSISTANT:")


def _bailing(*, think: bool) -> str:
    return _turns({"user": Turn("<role>HUMAN</role>"), "*": Turn("<role>{ROLE}</role>")},
                  generation="<role>ASSISTANT</role>" + ("<think>" if think else ""))


def _exaone(*, tool: bool) -> str:
    roles = {"system": Turn("[|system|]", "[|endofturn|]\n", trim=True),
             "user": Turn("[|user|]", "\n", trim=True),
             "assistant": Turn("[|assistant|]", "[|endofturn|]\n", trim=True)}
    if tool:
        roles["tool"] = Turn("[|tool|]", "[|endofturn|]\n", trim=True)
    return _turns(roles, generation="[|assistant|]")


def _granite4() -> str:
    return _turns({"assistant_tool_call": Turn("<|start_of_role|>assistant<|end_of_role|>"
                                               "<|tool_call|>", "<|end_of_text|>\n"),
                   "*": Turn("<|start_of_role|>{role}<|end_of_role|>", "<|end_of_text|>\n")},
                  generation="<|start_of_role|>assistant<|end_of_role|>")


MONARCH = """{%- for message in messages -%}
  {{- ('' if loop.first else '<s>') + message.role + '\\n' + message.content + '</s>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<s>assistant\\n' -}}
{%- endif -%}"""

GEMMA = """{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
  {%- set ns.system = ns.system + (message.content | trim) -%}
{%- else -%}
  {%- set role = 'model' if message.role == 'assistant' else message.role -%}
  {{- '<start_of_turn>' + role + '\\n' -}}
  {%- if ns.system and role != 'model' -%}
    {{- ns.system + '\\n\\n' -}}
    {%- set ns.system = '' -%}
  {%- endif -%}
  {{- (message.content | trim) + '<end_of_turn>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<start_of_turn>model\\n' -}}
{%- endif -%}"""

ORION = """{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
  {%- set ns.system = ns.system + message.content -%}
{%- elif message.role == 'user' -%}
  {{- 'Human: ' -}}
  {%- if ns.system -%}
    {{- ns.system + '\\n\\n' -}}
    {%- set ns.system = '' -%}
  {%- endif -%}
  {{- message.content + '\\n\\nAssistant: </s>' -}}
{%- else -%}
  {{- message.content + '</s>' -}}
{%- endif -%}
{%- endfor -%}"""

OPENCHAT = """{%- for message in messages -%}
{%- if message.role == 'system' -%}
  {{- message.content + '<|end_of_turn|>' -}}
{%- else -%}
  {{- 'GPT4 Correct ' + (message.role[:1] | upper) + message.role[1:] + ': ' -}}
  {{- message.content + '<|end_of_turn|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- 'GPT4 Correct Assistant:' -}}
{%- endif -%}"""

RWKV_WORLD = """{%- for message in messages -%}
{%- if message.role == 'system' -%}
  {{- 'System: ' + (message.content | trim) + '\\n\\n' -}}
{%- elif message.role == 'user' -%}
  {{- 'User: ' + (message.content | trim) + '\\n\\n' -}}
  {%- if loop.last -%}{{- 'Assistant:' -}}{%- endif -%}
{%- elif message.role == 'assistant' -%}
  {{- 'Assistant: ' + (message.content | trim) + '\\n\\n' -}}
{%- endif -%}
{%- endfor -%}"""

GIGACHAT = """{{- '<s>' -}}
{%- for message in messages -%}
{%- if loop.first and message.role == 'system' -%}
  {{- message.content + '<|message_sep|>' -}}
{%- elif message.role == 'user' -%}
  {{- 'user<|role_sep|>' + message.content + '<|message_sep|>' -}}
  {{- 'available functions<|role_sep|>[]<|message_sep|>' -}}
{%- elif message.role == 'assistant' -%}
  {{- 'assistant<|role_sep|>' + message.content + '<|message_sep|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- 'assistant<|role_sep|>' -}}
{%- endif -%}"""

BAILING2 = """{%- if not messages or messages[0].role != 'system' -%}
  {{- '<role>SYSTEM</role>detailed thinking off<|role_end|>' -}}
{%- endif -%}
{%- for message in messages -%}
{%- set role = 'HUMAN' if message.role == 'user' else (message.role | upper) -%}
  {{- '<role>' + role + '</role>' + message.content + '<|role_end|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<role>ASSISTANT</role>' -}}
{%- endif -%}"""

HUNYUAN_DENSE = """{%- for message in messages -%}
{%- if loop.first and message.role == 'system' -%}
  {{- message.content + '<｜hy_place▁holder▁no▁3｜>' -}}
{%- elif message.role == 'assistant' -%}
  {{- '<｜hy_Assistant｜>' + message.content + '<｜hy_place▁holder▁no▁2｜>' -}}
{%- elif message.role == 'user' -%}
  {{- '<｜hy_User｜>' + message.content + '<｜hy_Assistant｜>' -}}
{%- endif -%}
{%- endfor -%}"""

HUNYUAN_VL = """{{- '<｜hy_begin▁of▁sentence｜>' -}}
{%- for message in messages -%}
{%- if loop.first and message.role == 'system' -%}
  {{- message.content + '<｜hy_place▁holder▁no▁3｜>' -}}
{%- elif message.role == 'user' -%}
  {{- message.content + '<｜hy_User｜>' -}}
{%- elif message.role == 'assistant' -%}
  {{- message.content + '<｜hy_Assistant｜>' -}}
{%- endif -%}
{%- endfor -%}"""

PANGU_EMBEDDED = """{%- if messages and messages[0].role != 'system' -%}
  {{- '[unused9]系统：[unused10]' -}}
{%- endif -%}
{%- set names = {'system': '系统', 'user': '用户', 'assistant': '助手', 'tool': '工具',
                 'function': '方法'} -%}
{%- for message in messages -%}
{%- if message.role in names -%}
  {{- '[unused9]' + names[message.role] + '：' + message.content + '[unused10]' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '[unused9]助手：' -}}
{%- endif -%}"""


def _build() -> dict[str, str]:
    chatml = _turns({"*": Turn("<|im_start|>{role}\n", "<|im_end|>\n")},
                    generation="<|im_start|>assistant\n")
    return {
        "bailing": _bailing(think=False),
        "bailing-think": _bailing(think=True),
        "bailing2": BAILING2,
        "chatglm3": _turns({"*": Turn("<|{role}|>\n ")}, start="[gMASK]sop",
                           generation="<|assistant|>"),
        "chatglm4": _turns({"*": Turn("<|{role}|>\n")}, start="[gMASK]<sop>",
                           generation="<|assistant|>\n"),
        "chatml": chatml,
        "command-r": _turns(
            {"system": Turn("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                            trim=True),
             "user": Turn("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>",
                          trim=True),
             "assistant": Turn("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
                               "<|END_OF_TURN_TOKEN|>", trim=True)},
            generation="<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
        "deepseek": _turns({"system": Turn(""), "user": Turn("### Instruction:\n", "\n"),
                            "assistant": Turn("### Response:\n", "\n<|EOT|>\n")},
                           generation="### Response:\n"),
        "deepseek-ocr": _turns({"*": Turn("")}),
        "deepseek2": _turns({"system": Turn("", "\n\n"), "user": Turn("User: ", "\n\n"),
                             "assistant": Turn("Assistant: ", "<｜end▁of▁sentence｜>")},
                            generation="Assistant:"),
        "deepseek3": _turns({"system": Turn("", "\n\n"), "user": Turn("<｜User｜>"),
                             "assistant": Turn("<｜Assistant｜>", "<｜end▁of▁sentence｜>")},
                            generation="<｜Assistant｜>"),
        "exaone-moe": _turns({role: Turn(f"<|{role}|>\n", "<|endofturn|>\n", trim=True)
                              for role in ("system", "user", "assistant", "tool")},
                             generation="<|assistant|>\n"),
        "exaone3": _exaone(tool=False),
        "exaone4": _exaone(tool=True),
        "falcon3": _turns({"*": Turn("<|{role}|>\n", "\n")}, generation="<|assistant|>\n"),
        "gemma": GEMMA,
        "gigachat": GIGACHAT,
        "glmedge": _turns({"*": Turn("<|{role}|>\n")}, generation="<|assistant|>"),
        "gpt-oss": _turns({"assistant": Turn("<|start|>assistant<|message|>", "<|return|>"),
                           "*": Turn("<|start|>{role}<|message|>", "<|end|>")},
                          generation="<|start|>assistant"),
        "granite": _turns({"assistant_tool_call": Turn("<|start_of_role|>assistant_tool_call"
                                                       "<|end_of_role|><|tool_call|>",
                                                       "<|end_of_text|>\n"),
                           "*": Turn("<|start_of_role|>{role}<|end_of_role|>",
                                     "<|end_of_text|>\n")},
                          generation="<|start_of_role|>assistant<|end_of_role|>"),
        "granite-4.0": _granite4(),
        "granite-4.1": _granite4(),
        "grok-2": _turns({"system": Turn("System: ", "<|separator|>\n\n", trim=True),
                          "user": Turn("Human: ", "<|separator|>\n\n", trim=True),
                          "assistant": Turn("Assistant: ", "<|separator|>\n\n")},
                         generation="Assistant:"),
        "hunyuan-dense": HUNYUAN_DENSE,
        "hunyuan-moe": _turns({"system": Turn("<|startoftext|>", "<|extra_4|>"),
                               "assistant": Turn("", "<|eos|>"),
                               "*": Turn("<|startoftext|>", "<|extra_0|>")}),
        "hunyuan-vl": HUNYUAN_VL,
        "kimi-k2": _turns({"system": Turn("<|im_system|>system<|im_middle|>", "<|im_end|>"),
                           "user": Turn("<|im_user|>user<|im_middle|>", "<|im_end|>"),
                           "assistant": Turn("<|im_assistant|>assistant<|im_middle|>",
                                             "<|im_end|>"),
                           "tool": Turn("<|im_system|>tool<|im_middle|>", "<|im_end|>"),
                           "*": Turn("", "<|im_end|>")},
                          generation="<|im_assistant|>assistant<|im_middle|>"),
        "llama2": _llama2(system=False),
        "llama2-sys": _llama2(system=True),
        "llama2-sys-bos": _llama2(system=True, bos_inside=True),
        "llama2-sys-strip": _llama2(system=True, strip=True),
        "llama3": _turns({"*": Turn("<|start_header_id|>{role}<|end_header_id|>\n\n",
                                    "<|eot_id|>", trim=True)},
                         generation="<|start_header_id|>assistant<|end_header_id|>\n\n"),
        "llama4": _turns({"*": Turn("<|header_start|>{role}<|header_end|>\n\n", "<|eot|>",
                                    trim=True)},
                         generation="<|header_start|>assistant<|header_end|>\n\n"),
        "megrez": _turns({"*": Turn("<|role_start|>{role}<|role_end|>", "<|turn_end|>")},
                         generation="<|role_start|>assistant<|role_end|>"),
        "minicpm": _turns({"user": Turn("<用户>", "<AI>", trim=True), "*": Turn("", trim=True)}),
        "mistral-v1": _mistral(lead=" ", trail=" ", trim_assistant=False),
        "mistral-v3": _mistral(lead="", trail=" ", trim_assistant=True),
        "mistral-v3-tekken": _mistral(lead="", trail="", trim_assistant=False),
        "mistral-v7": _mistral_v7(" "),
        "mistral-v7-tekken": _mistral_v7(""),
        "monarch": MONARCH,
        "openchat": OPENCHAT,
        "orion": ORION,
        "pangu-embedded": PANGU_EMBEDDED,
        "phi3": _turns({"*": Turn("<|{role}|>\n", "<|end|>\n")}, generation="<|assistant|>\n"),
        "phi4": _turns({"*": Turn("<|im_start|>{role}<|im_sep|>", "<|im_end|>")},
                       generation="<|im_start|>assistant<|im_sep|>"),
        "rwkv-world": RWKV_WORLD,
        "seed_oss": _turns({"assistant": Turn("<seed:bos>assistant\n", "<seed:eos>", trim=True),
                            "*": Turn("<seed:bos>{role}\n", "<seed:eos>")},
                           generation="<seed:bos>assistant\n"),
        "smolvlm": _turns({"system": Turn("", "\n\n"),
                           "user": Turn("User: ", "<end_of_utterance>\n"),
                           "*": Turn("Assistant: ", "<end_of_utterance>\n")},
                          start="<|im_start|>", generation="Assistant:"),
        "solar-open": _turns({"*": Turn("<|begin|>{role}<|content|>", "<|end|>")},
                             generation="<|begin|>assistant"),
        "vicuna": _vicuna(orca=False),
        "vicuna-orca": _vicuna(orca=True),
        "yandex": _turns({"user": Turn(" Пользователь: ", "\n\n"),
                          "assistant": Turn(" Ассистент: ", "\n\n")},
                         generation=" Ассистент:[SEP]"),
        "zephyr": _turns({"*": Turn("<|{role}|>\n", "<|endoftext|>\n")},
                         generation="<|assistant|>\n"),
    }


BUILTIN_TEMPLATES: MappingProxyType[str, str] = MappingProxyType(_build())
