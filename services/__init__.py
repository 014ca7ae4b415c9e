"""Entry points: HTTP API, MCP server, CLI, settings and wiring."""
