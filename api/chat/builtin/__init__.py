"""llama.cpp's built-in chat templates, by name (`--chat-template NAME`)."""

from __future__ import annotations

from api.chat.builtin.detect import detect_builtin_template
from api.chat.builtin.sources import BUILTIN_TEMPLATES


def builtin_template_names() -> list[str]:
    """The names `--chat-template` accepts, sorted (as llama-server lists them)."""
    return sorted(BUILTIN_TEMPLATES)


__all__ = ["BUILTIN_TEMPLATES", "builtin_template_names", "detect_builtin_template"]
