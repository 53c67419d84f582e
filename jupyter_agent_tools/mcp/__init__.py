"""MCP (Model Context Protocol) for the agent tools: a front door over the same services as the routes.

:mod:`.server` speaks JSON-RPC for the Streamable HTTP transport (both protocol eras); :mod:`.tools` is the
tool table. Pure: no Tornado. Served by :mod:`jupyter_agent_tools.handlers.mcp` at ``/api/agent/mcp``.
"""
