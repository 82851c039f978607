"""--log-jsonl and --log-colors (llamaq/logs.py) as llama.cpp's common log writes them."""

from __future__ import annotations

import json
import logging

import pytest

from api.settings import ApiSettings
from llamaq.logs import BLUE, COLORS, RESET, ColorFormatter, JsonlFormatter
from worker.runtime.settings import WorkerSettings


def record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("api.x", level, __file__, 1, message, None, None)


def test_a_json_line_per_record() -> None:
    line = json.loads(JsonlFormatter(timestamps=True).format(record(logging.WARNING, "hot")))
    assert line["type"] == "log" and line["level"] == "warn" and line["msg"] == "hot\n"
    assert isinstance(line["time"], int) and line["time"] >= 0
    line = json.loads(JsonlFormatter(timestamps=False).format(record(logging.INFO, "é")))
    assert line == {"type": "log", "time": 0, "level": "info", "msg": "é\n"}


def test_colored_levels() -> None:
    text = ColorFormatter("%(levelname)s %(message)s").format(record(logging.ERROR, "bad"))
    assert text == f"{COLORS[logging.ERROR]}ERROR{RESET} bad"
    stamped = ColorFormatter("%(asctime)s %(levelname)s %(message)s").format(
        record(logging.INFO, "ok"))
    assert stamped.startswith(BLUE) and f"{COLORS[logging.INFO]}INFO{RESET} ok" in stamped


@pytest.mark.parametrize("role", [ApiSettings, WorkerSettings])
def test_the_flags_and_their_environment(role: type[ApiSettings] | type[WorkerSettings],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert role.from_args(["--log-jsonl"], environ={}).log_jsonl
    assert role.from_args([], environ={"LLAMA_ARG_LOG_JSONL": "1"}).log_jsonl
    assert role.from_args(["--log-colors", "enabled"], environ={}).log_colors == "on"
    assert role.from_args([], environ={"LLAMA_ARG_LOG_COLORS": "-1"}).log_colors == "auto"
    with pytest.raises(SystemExit):
        role.from_args(["--log-colors", "sometimes"], environ={})
    assert "unknown value for --log-colors: 'sometimes'" in capsys.readouterr().err
