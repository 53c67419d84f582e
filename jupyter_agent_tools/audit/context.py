"""Who is acting: the username jupyter_server resolved for the request being served.

The agent handlers set it when a request starts (:meth:`AgentAPIHandler.prepare`); the services read it
when they record an audit event or a session's owner, without Tornado and without an extra argument on
every service method. Each request runs in its own asyncio task, so each sees its own user, and tasks a
request starts inherit it; work the server does on its own (the idle sweep, the heartbeat, shutdown)
sees None.
"""

from __future__ import annotations

import re
from contextvars import ContextVar, Token

# How the person who holds the server's own token (or logged in with it) is named wherever a person is
# shown: to agents (who decided an approval) and in the Agents panel (who changed a cell, whose session).
OWNER_NAME = "the server's owner"
# The identity key of the server's own token (``handlers.base.acting_username``): it stays the key of
# that principal's sessions, runs and grants, but its token's hash is never shown as a name.
_OWNER_KEY = re.compile(r"token-[0-9a-f]{8}")

# The username of every agent token's user: agent:NAME.
AGENT_PREFIX = "agent:"

_USER: ContextVar[str | None] = ContextVar("jupyter_agent_tools_user", default=None)


def current_user() -> str | None:
    """The username of the request being served, or None for the server's own work."""
    return _USER.get()


def display_name(identity: str | None) -> str | None:
    """How ``identity`` (an acting username, as recorded) is shown: the server's own token principal
    (``token-`` and 8 hex digits) is :data:`OWNER_NAME`; anyone else by their username."""
    return OWNER_NAME if identity is not None and _OWNER_KEY.fullmatch(identity) else identity


def set_user(username: str | None) -> Token[str | None]:
    """Make ``username`` the acting user of this task (and of the tasks it starts)."""
    return _USER.set(username)


# Which agent token the request came with (its id, ``AgentToken.id``), or None: the approval gate keys its
# grants by it and the run registry records it, so that a token that ends ends what it started, and a new
# token of the same name inherits nothing.
_TOKEN: ContextVar[str | None] = ContextVar("jupyter_agent_tools_token", default=None)


def current_token() -> str | None:
    """The id of the agent token of the request being served, or None (not an agent token)."""
    return _TOKEN.get()


def set_token(token_id: str | None) -> Token[str | None]:
    """Make ``token_id`` the agent token of this task (and of the tasks it starts)."""
    return _TOKEN.set(token_id)


# Which front door the request came through: "http", "mcp", or "cli" when the client says so.
_VIA: ContextVar[str | None] = ContextVar("jupyter_agent_tools_via", default=None)


def current_via() -> str | None:
    """The front door of the request being served (http, mcp, cli), or None for the server's own work."""
    return _VIA.get()


def set_via(via: str | None) -> Token[str | None]:
    """Make ``via`` the front door of this task (and of the tasks it starts)."""
    return _VIA.set(via)


# Who approved the work being done (the approval gate): the ledger names them in the change's entry.
_APPROVER: ContextVar[str | None] = ContextVar("jupyter_agent_tools_approver", default=None)


def current_approver() -> str | None:
    """Who approved the work of this task (the approval gate), or None when nobody had to."""
    return _APPROVER.get()


def set_approver(name: str | None) -> Token[str | None]:
    """Say ``name`` approved the work of this task (and of the tasks it starts)."""
    return _APPROVER.set(name)
