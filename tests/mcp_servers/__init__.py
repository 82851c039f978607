"""Real MCP servers for the tests, run as `python <file>` over stdio: `echo_server.py` is
written with the official `mcp` SDK (the one api/tools/mcp_client.py speaks to); the others
misbehave on purpose (garbage on stdout, no answer to initialize)."""
