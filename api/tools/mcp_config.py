"""The spec's MCP server definitions (Cursor's `mcpServers` format), from --mcp-servers-config
(a file) and --mcp-servers-json; as llama-server reads them (`server-mcp.cpp`): JSON that does
not parse or a file that cannot be read stops the start; an entry without a command is
skipped; a name given twice keeps its first definition."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, ValidationError

from scheduler.contract.deferred import DeferredModel

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MS = 30000


class McpServerConfig(DeferredModel):
    name: str
    command: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str = ""
    timeout_ms: int = DEFAULT_TIMEOUT_MS


@dataclass(frozen=True)
class McpToolDef:
    """One tool a server listed."""

    server_name: str
    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)


def parse_mcp_json(text: str) -> list[McpServerConfig]:
    try:
        doc: Any = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"failed to parse MCP config JSON: {exc}") from None
    servers = doc.get("mcpServers") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        return []
    found = []
    for name, entry in servers.items():
        entry = entry if isinstance(entry, dict) else {}
        fields = {"name": name, "command": entry.get("command") or "",
                  "cwd": entry.get("cwd") or ""}
        if isinstance(entry.get("timeout_ms"), int):
            fields["timeout_ms"] = entry["timeout_ms"]
        if isinstance(entry.get("args"), list):
            fields["args"] = entry["args"]
        if isinstance(entry.get("env"), dict):
            fields["env"] = entry["env"]
        try:
            config = McpServerConfig.model_validate(fields)
        except ValidationError as exc:
            raise ValueError(f"failed to parse MCP config JSON: server '{name}': "
                             f"{exc.errors()[0]['msg']}") from None
        if not config.command:
            log.warning("MCP server '%s' has no command, skipping", name)
            continue
        found.append(config)
    return found


def load_mcp_configs(config_file: str | None, inline: str | None) -> list[McpServerConfig]:
    texts = []
    if config_file:
        try:
            with open(config_file, encoding="utf-8") as f:
                texts.append(f.read())
        except OSError:
            raise ValueError(f"failed to open MCP config file: {config_file}") from None
    if inline:
        texts.append(inline)
    configs: dict[str, McpServerConfig] = {}
    for text in texts:
        parsed = parse_mcp_json(text)
        if not parsed:
            log.warning("MCP config: no servers found in JSON")
        for config in parsed:
            if config.name in configs:
                log.warning("MCP config: duplicate server name '%s', skipping", config.name)
                continue
            configs[config.name] = config
    return list(configs.values())
