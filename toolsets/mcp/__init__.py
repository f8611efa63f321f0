"""Model Context Protocol servers as a tool source (the official ``mcp`` SDK, 2.x).

- :mod:`.config`: the ``mcpServers`` JSON file named by ``GATEWAY_MCP_CONFIG``
- :mod:`.names`: ``server__tool`` names within the providers' rules
- :mod:`.results`: an MCP tool result as the text the model gets
- :mod:`.connection`: one server, supervised (start, watch, restart with backoff, stop)
- :mod:`.toolbox`: every configured server as one :class:`gateway.edge.tools.ToolSource`
"""

from toolsets.mcp.config import McpConfig, ServerConfig, load_config
from toolsets.mcp.toolbox import McpToolbox, ToolboxSettings

__all__ = ["McpConfig", "McpToolbox", "ServerConfig", "ToolboxSettings", "load_config"]
