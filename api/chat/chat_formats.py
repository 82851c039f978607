"""Which output format a chat template's models write, told from the template's text (as
llama.cpp's `common_chat_try_specialized_template` and its auto-parser's workarounds tell it),
and what the parser needs of each: the tool-call blocks only that family writes, the markers
dropped from content, and the tokens the worker must write as text (llama.cpp's
`preserved_tokens`: a template's special tokens that mark reasoning or tool calls, often
CONTROL tokens that a plain detokenization leaves out).

gpt-oss (harmony) is not here: its own parser (harmony.py) reads it whole.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from api.chat.autoparse.analysis import analyze
from api.chat.autoparse.streamed import CallsReader, partial_reader
from api.chat.autoparse.syntax import auto_syntax
from api.chat.family_calls import (
    DSML,
    MINIMAX_M3_NS,
    parse_apertus_calls,
    parse_dsml_calls,
    parse_functools,
    parse_gemma4_call,
    parse_json_calls,
    parse_kimi_k3_tools,
    parse_minicpm5_call,
    parse_minimax_m3_calls,
    parse_muse_call,
    parse_pythonic_calls,
)
from api.chat.harmony import PRESERVED_TOKENS as HARMONY_TOKENS
from api.chat.harmony import is_harmony_template
from api.chat.listed_calls import parse_listed_calls
from api.chat.reasoning_tags import KIMI_K3_MARKERS, reasoning_tags
from api.chat.tagged_calls import (
    KIMI_ARGS_BEGIN,
    KIMI_CALL_BEGIN,
    KIMI_CALL_END,
    KIMI_SECTION_BEGIN,
    KIMI_SECTION_END,
    ParamTypes,
    parse_command_r_action,
    parse_function_xml,
    parse_glm_tool_call,
    parse_granite_calls,
    parse_kimi_call,
    parse_kimi_section,
    parse_minimax_calls,
    parse_tool_call_block,
    parse_xml_calls,
)
from api.chat.tool_formats import (
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    ParsedCall,
    parse_deepseek_calls,
    parse_function_tag,
)
from api.chat.tool_grammar import CallFrame

BlockParser = Callable[[str, ParamTypes], "list[ParsedCall] | None"]
TO_THE_END = ""
"""A block's end tag when the block runs to the end of the answer (Granite)."""

GENERIC_MARKERS = ("<tool_call>", "</tool_call>", "<function=", "</function>", "[TOOL_CALLS]",
                   "[ARGS]", "[CALL_ID]", "<|python_tag|>", "<｜tool▁calls▁begin｜>",
                   "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                   "<｜tool▁sep｜>")
"""The markers of the formats every template gets (parsing.py, tool_formats.py)."""
GENERIC_BLOCKS: dict[str, tuple[str, BlockParser]] = {
    "<tool_call>": ("</tool_call>", parse_tool_call_block),
    "<function=": ("</function>", lambda inner, _types: parse_function_tag(inner)),
    DEEPSEEK_CALLS_BEGIN: (DEEPSEEK_CALLS_END, lambda inner, _types: parse_deepseek_calls(inner)),
}
"""The call blocks every template's parser reads (beside the family's own)."""


@dataclass(frozen=True)
class ChatFormat:
    name: str
    blocks: Mapping[str, tuple[str, BlockParser]] = field(default_factory=dict)
    """Start marker → (end marker or TO_THE_END, the block's parser), beside the generic ones
    (a marker here replaces the generic one)."""
    dropped: tuple[str, ...] = ()
    """Markers that frame content and are not part of it (Command-R7B's response tags)."""
    dropped_reasoning: tuple[str, ...] = ()
    """Markers dropped from content only where reasoning is parsed (not under format none)."""
    markers: tuple[str, ...] = ()
    """The family's own special tokens, for preserved_tokens."""
    reasoning_ends: tuple[str, ...] = ()
    """Markers that end an unclosed thinking block and stay (a call written before the block
    is closed: Ling 3's `<tool_call>`)."""
    echo_opened: bool = True
    """With reasoning format none, whether content starts with the thinking tag the prompt
    opened (llama.cpp's parsers of Kimi K3 and Ling 3 leave it out, and the closing tag)."""
    stops: tuple[str, ...] = ()
    """Stop strings the request gets beside its own (llama.cpp's `additional_stops`)."""
    frame: CallFrame | None = None
    """How a forced call is written, where the family's calls are JSON (tool_grammar.py)."""
    reasoning: tuple[str, str] | None = None
    """The thinking tags, where the template's analysis found others than reasoning_tags.py
    knows (the auto-parser's)."""
    streamed: Mapping[object, CallsReader] = field(default_factory=dict)
    """Block parser → the reader of its block while it is still open, for the blocks here
    whose calls stream as they are written beside those of streamed_calls.py (the
    auto-parser's: autoparse/streamed.py)."""


GENERIC = ChatFormat("generic")
GPT_OSS = ChatFormat("gpt-oss", markers=HARMONY_TOKENS)
COMMAND_R7B = ChatFormat(
    "command-r7b",
    blocks={"<|START_ACTION|>": ("<|END_ACTION|>", parse_command_r_action)},
    dropped=("<|START_RESPONSE|>", "<|END_RESPONSE|>"),
    frame=CallFrame("<|START_ACTION|>", "<|END_ACTION|>", shape="r7b", listed=True),
    markers=("<|START_ACTION|>", "<|END_ACTION|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>"))
COHERE2_MOE = ChatFormat(
    "cohere2moe",
    blocks={"<|START_ACTION|>": ("<|END_ACTION|>", parse_command_r_action)},
    dropped=("<|START_TEXT|>", "<|END_TEXT|>"),
    frame=CallFrame("<|START_ACTION|>", "<|END_ACTION|>", shape="r7b", listed=True),
    markers=("<|START_ACTION|>", "<|END_ACTION|>", "<|START_TEXT|>", "<|END_TEXT|>"))
GRANITE = ChatFormat("granite", blocks={"<|tool_call|>": (TO_THE_END, parse_granite_calls)},
                     markers=("<|tool_call|>",), frame=CallFrame("<|tool_call|>", listed=True))
GLM_45 = ChatFormat("glm-4.5", blocks={"<tool_call>": ("</tool_call>", parse_glm_tool_call)},
                    markers=("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
                             "<arg_value>", "</arg_value>"))
KIMI_K2 = ChatFormat(
    "kimi-k2",
    blocks={KIMI_SECTION_BEGIN: (KIMI_SECTION_END, parse_kimi_section),
            KIMI_CALL_BEGIN: (KIMI_CALL_END, parse_kimi_call)},
    reasoning_ends=(KIMI_SECTION_BEGIN, KIMI_CALL_BEGIN),
    markers=(KIMI_SECTION_BEGIN, KIMI_SECTION_END, KIMI_CALL_BEGIN, KIMI_ARGS_BEGIN,
             KIMI_CALL_END))
MINIMAX_M2 = ChatFormat(
    "minimax-m2",
    blocks={"<minimax:tool_call>": ("</minimax:tool_call>", parse_minimax_calls)},
    markers=("<minimax:tool_call>", "</minimax:tool_call>"))
SEED_OSS = ChatFormat(
    "seed-oss", blocks={"<seed:tool_call>": ("</seed:tool_call>", parse_xml_calls)},
    markers=("<seed:tool_call>", "</seed:tool_call>"))
QWEN3_CODER = ChatFormat(
    "qwen3-coder",
    # a call whose `<tool_call>` the model left out (llama.cpp's parser takes it too)
    blocks={"<function=": ("</function>", parse_function_xml)},
    dropped=("</tool_call>",), reasoning_ends=("<tool_call>",),
    markers=("<tool_call>", "</tool_call>"))
FUNCTIONARY_V3_2 = ChatFormat("functionary-v3.2", markers=(">>>all",))

MUSE_GLIMMER = ChatFormat(
    "muse-glimmer",
    blocks={"to=": ("</atem:function_calls>", parse_muse_call)},
    dropped=("<|start|>assistant", " to=user<|message|>", "to=user<|message|>", "<|eot|>",
             "<|eom|>"),
    markers=("<|start|>", "<|message|>", "<|eom|>", "<|eot|>", "<atem:function_calls>",
             "<atem:invoke", "<atem:parameter", "</atem:parameter>", "</atem:invoke>",
             "</atem:function_calls>"))
LING3 = ChatFormat(
    "ling3", blocks={"<tool_call>": ("</tool_call>", parse_glm_tool_call)},
    dropped=("<|role_end|>", "</think>"), reasoning_ends=("<tool_call>",),
    stops=("<|role_end|>",), echo_opened=False,
    markers=("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
             "</arg_value>", "<|role_end|>"))
KIMI_K3 = ChatFormat(
    "kimi-k3",
    blocks={"<|open|>tools<|sep|>": ("<|close|>tools<|sep|>", parse_kimi_k3_tools)},
    dropped=('<|open|>message role="assistant"<|sep|>', "<|open|>response<|sep|>",
             "<|close|>response<|sep|>", "<|close|>message<|sep|>", "<|end_of_msg|>",
             "<|close|>think<|sep|>"),
    reasoning_ends=("<|open|>response<|sep|>",), echo_opened=False,
    markers=(*KIMI_K3_MARKERS, "<|sep|>"))
LFM2 = ChatFormat(
    "lfm2", blocks={"<|tool_call_start|>": ("<|tool_call_end|>", parse_pythonic_calls)},
    markers=("<|tool_call_start|>", "<|tool_call_end|>", "<|tool_list_start|>",
             "<|tool_list_end|>"))
GEMMA4 = ChatFormat(
    "gemma4", blocks={"<|tool_call>": ("<tool_call|>", parse_gemma4_call)},
    # an empty thought channel or a stray channel tag after the content is no content
    dropped=("<|channel>thought\n<channel|>", "<|channel>thought<channel|>"),
    # and, read with reasoning, a stray `<|channel>` not opening a thought (llama.cpp consumes
    # those before the answer's thought)
    dropped_reasoning=("<channel|>", "<|channel>"),
    markers=("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|turn>"))
DEEPSEEK_V3_2 = ChatFormat(
    "deepseek-v3.2",
    blocks={f"<{DSML}function_calls>": (f"</{DSML}function_calls>", parse_dsml_calls),
            f"<{DSML}tool_calls>": (f"</{DSML}tool_calls>", parse_dsml_calls)},
    reasoning_ends=(f"<{DSML}function_calls>", f"<{DSML}tool_calls>"))
MINIMAX_M3 = ChatFormat(
    "minimax-m3",
    blocks={f"{MINIMAX_M3_NS}<tool_call>": (f"{MINIMAX_M3_NS}</tool_call>",
                                           parse_minimax_m3_calls)},
    dropped=("</mm:think>",), markers=(MINIMAX_M3_NS,))
MINICPM5 = ChatFormat(
    "minicpm5", blocks={'<function name="': ("</function>", parse_minicpm5_call)})
NEMOTRON_V2 = ChatFormat(
    "nemotron-v2", blocks={"<TOOLCALL>": ("</TOOLCALL>", parse_listed_calls)},
    markers=("<TOOLCALL>", "</TOOLCALL>"),
    frame=CallFrame("<TOOLCALL>", "</TOOLCALL>", listed=True))
APRIEL = ChatFormat(
    "apriel", blocks={"<tool_calls>": ("</tool_calls>", parse_listed_calls)},
    markers=("<tool_calls>", "</tool_calls>"),
    frame=CallFrame("<tool_calls>", "</tool_calls>", listed=True))
APERTUS = ChatFormat(
    "apertus", blocks={"<|tools_prefix|>": ("<|tools_suffix|>", parse_apertus_calls)},
    markers=("<|tools_prefix|>", "<|tools_suffix|>"),
    frame=CallFrame("<|tools_prefix|>", "<|tools_suffix|>", shape="apertus", listed=True))
GIGACHAT_V3_1 = ChatFormat(
    "gigachat-v3.1", blocks={"<|function_call|>": (TO_THE_END, parse_json_calls)},
    markers=("<|function_call|>",), frame=CallFrame("<|function_call|>"))
FIREFUNCTION_V2 = ChatFormat(
    "firefunction-v2", blocks={"functools[": (TO_THE_END, parse_functools)},
    markers=("functools",), frame=CallFrame(" functools", listed=True))
COMMAND_R_PLUS = ChatFormat(
    "command-r-plus", blocks={"Action:\n```json": ("```", parse_command_r_action)},
    dropped=("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
    markers=("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"))
GIGACHAT_V3 = ChatFormat(
    "gigachat-v3",
    blocks={"<|message_sep|>\n\nfunction call<|role_sep|>\n": (TO_THE_END, parse_json_calls)},
    markers=("<|message_sep|>\n\n", "<|role_sep|>\n"),
    frame=CallFrame("<|message_sep|>\n\nfunction call<|role_sep|>\n"))

_DETECTION: tuple[tuple[ChatFormat, tuple[str, ...], tuple[str, ...]], ...] = (
    # (format, strings the template has, strings it has not)
    # in llama.cpp's order (common_chat_try_specialized_template), then its auto-parser's
    (FUNCTIONARY_V3_2, (">>>all", ">>>${recipient}"), ()),
    (KIMI_K2, (KIMI_SECTION_BEGIN, KIMI_CALL_BEGIN), ()),
    (MUSE_GLIMMER, ("<atem:function_calls>", "<|eom|>"), ()),
    (KIMI_K3, KIMI_K3_MARKERS, ()),
    (LING3, ("<role>ASSISTANT</role>", "<arg_key>"), ()),
    (COHERE2_MOE, ("<|START_TEXT|>", "<|START_ACTION|>"), ()),
    (LFM2, ("<|tool_list_start|>", "<|tool_list_end|>"), ()),
    (LFM2, ("List of tools: [",), ("<|tool_list_start|>",)),
    (GIGACHAT_V3, ("<|role_sep|>", "<|message_sep|>"), ("<|function_call|>",)),
    (MINIMAX_M3, (MINIMAX_M3_NS, "<tool_call>", "<invoke name="), ()),
    (DEEPSEEK_V3_2, ("dsml_token", "DSML", "function_calls"), ()),
    (DEEPSEEK_V3_2, ("dsml_token", "DSML", "tool_calls"), ()),
    (GEMMA4, ("'<|tool_call>call:'",), ()),
    (MINICPM5, ("Tool usage guidelines:", '<function name="', '<param name="'), ()),
    (GIGACHAT_V3_1, ("<|role_sep|>", "<|message_sep|>", "<|function_call|>"), ()),
    (FIREFUNCTION_V2, ("functools[",), ()),
    (COMMAND_R_PLUS, ("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "Action:"),
     ("<|START_ACTION|>",)),
    (COMMAND_R7B, ("<|START_ACTION|>", "<|START_RESPONSE|>"), ("<|START_TEXT|>",)),
    (MINIMAX_M2, ("<minimax:tool_call>", "<invoke name="), ("]<]minimax[>[",)),
    (NEMOTRON_V2, ("<TOOLCALL>",), ()),
    (APRIEL, ("<tool_calls>",), ()),
    (APERTUS, ("<|tools_prefix|>",), ()),
    (SEED_OSS, ("<seed:tool_call>",), ()),
    (GLM_45, ("<tool_call>", "<arg_key>", "<arg_value>"), ("<role>ASSISTANT</role>",)),
    (QWEN3_CODER, ("<tool_call>", "<function=", "<parameter="),
     ("'<tool_call><function=' ~ tool_call.name ~ '>'",)),
    (GRANITE, ("<|tool_call|>",), ()),
)


def detect_chat_format(template_source: str) -> ChatFormat:
    """The format a template's models write: a family's, else what llama.cpp's auto-parser
    derives from the template (`auto`, autoparse/), else GENERIC."""
    if is_harmony_template(template_source):
        return GPT_OSS
    for chat_format, present, absent in _DETECTION:
        if all(s in template_source for s in present) and \
                not any(s in template_source for s in absent):
            return chat_format
    return _auto_format(template_source)


@functools.lru_cache(maxsize=32)
def _auto_format(template_source: str) -> ChatFormat:
    """The auto-parser's format of a template no family claims (analysed once per template);
    GENERIC where the analysis adds nothing to the generic reader."""
    syntax = auto_syntax(template_source)
    if syntax is None:
        return GENERIC
    blocks: dict[str, tuple[str, BlockParser]] = {}
    streamed: dict[object, CallsReader] = {}
    if syntax.read is not None:
        blocks[syntax.start] = (syntax.end or TO_THE_END, syntax.read)
        reader = partial_reader(analyze(template_source).tools)
        if reader is not None:
            streamed[syntax.read] = reader
    return ChatFormat("auto", blocks=blocks, dropped=syntax.dropped, markers=syntax.markers,
                      reasoning=syntax.reasoning, streamed=streamed)


_SPECIALIZED = frozenset({
    "gpt-oss", "functionary-v3.2", "muse-glimmer", "kimi-k2", "kimi-k3", "ling3", "cohere2moe",
    "lfm2", "gigachat-v3", "minimax-m3", "deepseek-v3.2", "gemma4", "minicpm5", "qwen3-coder"})
"""The families llama.cpp reads with a parser of its own (common/parsers/); it reads the other
templates with its auto-parser."""


def llama_auto_parsed(template_source: str) -> bool:
    """Whether llama.cpp reads the template with its auto-parser (no parser of its own)."""
    return detect_chat_format(template_source).name not in _SPECIALIZED and not all(
        s in template_source for s in ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]"))


def continuation_tags(template_source: str) -> tuple[str, str] | None:
    """The thinking tags llama.cpp writes a continued message's reasoning in, where its
    auto-parser reads the template (the tags as its analysis found them, whitespace included);
    None: the family's own (reasoning_tags.py)."""
    name = detect_chat_format(template_source).name
    if all(s in template_source for s in ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]")) and \
            "[CALL_ID]" not in template_source:  # llama.cpp's Ministral 3 parser thinks so
        return "[THINK]", "[/THINK]"
    if name in _SPECIALIZED:
        return None
    try:
        reasoning = analyze(template_source).reasoning
    except Exception:  # a template the analysis cannot render keeps the family's tags
        return None
    if reasoning.mode == "NONE" or not reasoning.start.strip():
        return None
    return reasoning.start, reasoning.end


_HERMES = CallFrame("<tool_call>\n", "\n</tool_call>", separator="\n")
_MISTRAL = CallFrame("[TOOL_CALLS]", listed=True)
_LLAMA3 = CallFrame("", shape="name_parameters")


def call_frame(template_source: str) -> CallFrame | None:
    """How a forced tool call is written under this template (None: llama.cpp's generic
    JSON, for the families whose calls are not JSON in markers)."""
    chat_format = detect_chat_format(template_source)
    if chat_format is not GENERIC:
        return chat_format.frame
    if "<tool_call>" in template_source:  # Hermes, Qwen 2.5 / 3: JSON in <tool_call>
        return _HERMES
    if "[TOOL_CALLS]" in template_source and "[ARGS]" not in template_source:
        return _MISTRAL  # Mistral Nemo: [TOOL_CALLS][{"name", "arguments"}]
    if '"parameters": dictionary of argument name' in template_source:  # Llama 3.x
        return _LLAMA3
    return None


def preserved_tokens(template_source: str) -> list[str]:
    """The strings the worker writes as text even when they are special tokens (each is kept
    only where it is one token of the model's vocabulary, as llama-server keeps them)."""
    chat_format = detect_chat_format(template_source)
    if chat_format is GPT_OSS:
        return list(HARMONY_TOKENS)
    tokens = [*reasoning_tags(template_source), *GENERIC_MARKERS, *chat_format.markers]
    return list(dict.fromkeys(tokens))
