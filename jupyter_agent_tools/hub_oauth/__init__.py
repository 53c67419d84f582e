"""OAuth sign-in for MCP clients on a JupyterHub: a hub service that is the authorization server of every
user's server (issue 45 B). :mod:`.service` holds the state and signs the tokens, :mod:`.app` is the web
application the hub runs (``python -m jupyter_agent_tools.hub_oauth``); the single-user servers check the
tokens with :mod:`jupyter_agent_tools.auth.hub_tokens`. docs/admin.md shows the hub's configuration.
"""
