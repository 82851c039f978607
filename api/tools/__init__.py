"""Server tools (llama-server's `server-tools.cpp`) and MCP servers (`server-mcp.cpp`), run on
the api pod that serves the request: built-in tools (`builtin/`), the MCP client
(`mcp_client.py`), where a call runs (`runtime.py`, `host_io.py`, `container_io.py`), path
confinement (`paths.py`), and the pod's set of tools (`service.py`)."""
