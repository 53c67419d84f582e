"""The person on a JupyterHub single-user server, as the hub tells it.

jupyterhub-singleuser's identity provider resolves every request that does not carry an agent token (those
are decided by :class:`~.identity.AgentTokens` first) to a user whose ``hub_user`` is the hub's model of
the token that authenticated it: the user's name, the token's scopes, and ``session_id``, which only a
token the hub issued through its login (the person's browser, by OAuth) has. An API token the person
made (``/hub/token``, ``POST /hub/api/users/NAME/tokens``) has none: an agent may hold one, and with it
it is the person on every route the hub guards. So deciding an approval asks more of a hub user than
being one: their browser session, or a scope the admin names for it (``ApprovalPolicy.hub_decider_scopes``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

PANEL = "JupyterLab's Agents panel"


def hub_model(user: Any) -> Mapping[str, Any] | None:
    """The hub's model of the user and token of a request (JupyterHub's ``JupyterHubUser``), else None."""
    model = getattr(user, "hub_user", None)
    return model if isinstance(model, Mapping) else None


def holds_scope(model: Mapping[str, Any], scopes: Iterable[str]) -> bool:
    """Whether the token's scopes grant one of ``scopes`` for this server's user (a scope given for every
    user, or filtered to this one or to this server)."""
    wanted = set(scopes)
    if not wanted:
        return False
    user = os.environ.get("JUPYTERHUB_USER") or str(model.get("name") or "")
    server = f"{user}/{os.environ.get('JUPYTERHUB_SERVER_NAME', '')}"
    for held in model.get("scopes") or ():
        base, _, where = str(held).partition("!")
        if base in wanted and where in ("", f"user={user}", f"server={server}"):
            return True
    return False


def decider_refusal(user: Any, decider_scopes: Iterable[str]) -> str | None:
    """Why ``user`` may not decide an approval on this server, or None if it may: anyone who is not a hub
    user (the server's own token, a password login) may; a hub user from their browser session, or with
    a token holding one of ``decider_scopes``."""
    model = hub_model(user)
    if model is None or model.get("session_id"):
        return None
    scopes = list(decider_scopes)
    if holds_scope(model, scopes):
        return None
    allowed = f" or with a token holding the scope {' or '.join(scopes)}" if scopes else ""
    return (
        f"On JupyterHub only the person decides: in {PANEL}, logged in through the hub{allowed}. This "
        "request came with a hub API token, which an agent may hold; the admin can let such tokens decide "
        "with c.ApprovalPolicy.hub_decider_scopes (docs/admin.md)."
    )
