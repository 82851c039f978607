"""A fleet over a tiny GGUF that carries a real model's chat template: one worker and two api
pods, one that parses the template's tool calls and one that skips chat parsing (it shows the
raw text a grammar forced). Shared by the `tool_choice: "required"` tests of each format."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.conftest import make_fleet
from tests.paths import DATA
from tests.tiny_gguf import write_tiny_llama


def parsed_and_raw_apis(redis_url: str, workdir: Path, folder: Path, template_file: str,
                        alias: str, n_ctx: int = 8192,
                        **model: Any) -> Iterator[tuple[str, str]]:
    """Yields (parsed api, raw api) for a tiny model named `alias` with the template of
    tests/data/templates/`template_file`; `model` goes on to write_tiny_llama."""
    template = (DATA / "templates" / template_file).read_text("utf-8")
    gguf = write_tiny_llama(folder / f"{alias}.gguf", chat_template=template, n_ctx=n_ctx,
                            **model)
    fleet = make_fleet(redis_url, workdir, gguf, alias)
    fleet.add_worker("-c", str(n_ctx), "-np", "1", "-t", "1")
    parsed = fleet.add_api("--jinja")
    raw = fleet.add_api("--jinja", "--skip-chat-parsing")
    fleet.wait_healthy(parsed)
    fleet.wait_healthy(raw)
    yield parsed, raw
    fleet.stop()
