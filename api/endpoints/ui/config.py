"""`--ui-config` / `--ui-config-file`: the UI's default preferences, a JSON object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from api.settings import ApiSettings


def ui_defaults(settings: ApiSettings) -> dict[str, Any]:
    """The server's default UI preferences (`ui_settings` in /props); raises ValueError with
    the flag to fix when the JSON is unreadable or not an object. The file's keys come first,
    the inline JSON's override them."""
    merged: dict[str, Any] = {}
    sources: list[tuple[str, str]] = []
    if settings.ui_config_file:
        try:
            sources.append(("--ui-config-file", Path(settings.ui_config_file).read_text("utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read --ui-config-file: {exc}") from None
    if settings.ui_config:
        sources.append(("--ui-config", settings.ui_config))
    for name, text in sources:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be a JSON object")
        merged.update(value)
    return merged
