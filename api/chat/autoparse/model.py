"""What llama.cpp's differential analysis finds in a template (common/chat-auto-parser.h)."""

from __future__ import annotations

from dataclasses import dataclass, field

from api.chat.autoparse.tool_analysis import ToolAnalysis


@dataclass
class Reasoning:
    mode: str = "NONE"  # NONE, TAG_BASED, TOOLS_ONLY
    start: str = ""
    end: str = ""


@dataclass
class Content:
    mode: str = "PLAIN"  # PLAIN, ALWAYS_WRAPPED, WRAPPED_WITH_REASONING
    start: str = ""
    end: str = ""


@dataclass
class Analysis:
    reasoning: Reasoning = field(default_factory=Reasoning)
    content: Content = field(default_factory=Content)
    tools: ToolAnalysis = field(default_factory=ToolAnalysis)
    user_start: str = ""
    assistant_start: str = ""
    supports_tool_calls: bool = False
    supports_parallel_tool_calls: bool = False
