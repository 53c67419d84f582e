"""Agent identities: scoped, revocable agent tokens on any Jupyter server.

Two lines of server configuration turn them on (docs/admin.md)::

    c.ServerApp.identity_provider_class = "jupyter_agent_tools.auth.AgentIdentityProvider"
    c.ServerApp.authorizer_class = "jupyter_agent_tools.auth.AgentAuthorizer"

:mod:`.store` keeps the tokens (hashed, SQLite), :mod:`.identity` turns a token into the user
``agent:NAME``, :mod:`.authorizer` applies its scopes (:mod:`.scopes`) and path globs (:mod:`.paths`) on
every route of the server.
"""

from __future__ import annotations

from .authorizer import AgentAuthorizer
from .identity import AGENT_PREFIX, AgentIdentityProvider, AgentUser
from .store import TOKEN_PREFIX, AgentToken, TokenStore

__all__ = [
    "AGENT_PREFIX",
    "TOKEN_PREFIX",
    "AgentAuthorizer",
    "AgentIdentityProvider",
    "AgentToken",
    "AgentUser",
    "TokenStore",
]
