"""OAuth 2.1 sign-in for MCP clients: the server is the authorization server of its own MCP endpoint.

:mod:`.core` is pure (PKCE, redirect URIs, client metadata, codes, metadata documents), :mod:`.grants`
keeps clients and grants (SQLite), :mod:`.service` is the configurable service (``c.AgentOAuth.*``).
"""
