"""Agent tokens in front of another identity provider, and who decides on a hub (pure parts, no server).

The whole flow runs against a real JupyterHub in ``test_jupyterhub.py``; here: the wrapping keeps the
wrapped provider's class, settings and state and takes ``c.AgentIdentityProvider.*``; it stands wherever
the server and its authorizers look; a hub user decides only from a browser session or with a scope the
admin names (filters included); named servers get their own token file; the admin's lifetime cap.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider, User
from jupyter_server.serverapp import ServerApp
from jupyterhub.singleuser.extension import JupyterHubIdentityProvider, JupyterHubUser
from traitlets.config import Config

from jupyter_agent_tools.auth import AgentAuthorizer, AgentIdentityProvider
from jupyter_agent_tools.auth.hub import decider_refusal, holds_scope
from jupyter_agent_tools.auth.identity import AgentTokens, _per_server, adopt_agent_tokens, with_agent_tokens
from jupyter_agent_tools.errors import AgentToolsError

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


def hub_user(**model: Any) -> JupyterHubUser:
    return JupyterHubUser({"name": "alice", "scopes": [], "session_id": None, **model})


def test_only_a_browser_session_or_a_named_scope_decides_on_a_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", "")
    assert decider_refusal(User(username="owner"), []) is None  # not a hub user: the server's own
    assert decider_refusal(hub_user(session_id="abc"), []) is None  # logged in through the hub
    refused = decider_refusal(hub_user(scopes=["access:servers!server=alice/"]), [])
    assert refused and "Agents panel" in refused and "hub_decider_scopes" in refused
    scope = "custom:agent-approvals"
    for held, decides in [
        ([scope], True),
        ([f"{scope}!user=alice"], True),
        ([f"{scope}!server=alice/"], True),
        ([f"{scope}!user=bob"], False),
        ([f"{scope}!server=alice/other"], False),
        (["custom:agent-approvals-not"], False),
        (["access:servers!server=alice/"], False),
    ]:
        assert (decider_refusal(hub_user(scopes=held), [scope]) is None) is decides, held
        assert holds_scope({"name": "alice", "scopes": held}, []) is False  # no scope named: none decides


def test_the_wrapped_provider_keeps_its_class_state_and_takes_the_agent_settings() -> None:
    made = with_agent_tokens(JupyterHubIdentityProvider)
    assert made is with_agent_tokens(JupyterHubIdentityProvider)  # one class per provider class
    assert made.__mro__[1:3] == (AgentTokens, JupyterHubIdentityProvider)
    assert with_agent_tokens(AgentIdentityProvider) is AgentIdentityProvider  # already takes them
    config = Config({"AgentIdentityProvider": {"max_token_lifetime": 3600.0}})
    provider = made(config=config)
    assert provider.max_token_lifetime == 3600.0  # c.AgentIdentityProvider.* as on a plain server
    assert provider.lifetime(None) == 3600.0 and provider.lifetime(60.0) == 60.0
    with pytest.raises(AgentToolsError, match="max_token_lifetime") as refused:
        provider.lifetime(7200.0)
    assert refused.value.status == 400
    assert AgentIdentityProvider().lifetime(None) is None  # no cap: until revoked


def test_adopting_puts_the_wrapper_where_the_server_and_authorizers_look() -> None:
    original = PasswordIdentityProvider(token="secret")
    authorizer = AgentAuthorizer(identity_provider=original)
    server = ServerApp()  # not started: the two configurables it would have made, given
    server.identity_provider, server.authorizer = original, authorizer
    server.web_app = SimpleNamespace(settings={})
    wrapped = adopt_agent_tokens(server)
    assert isinstance(wrapped, AgentTokens) and isinstance(wrapped, PasswordIdentityProvider)
    assert wrapped.token == "secret"  # the wrapped provider's settings, as they were
    assert server.identity_provider is wrapped and server.web_app.settings["identity_provider"] is wrapped
    assert authorizer.identity_provider is wrapped and authorizer.inner.identity_provider is wrapped
    assert adopt_agent_tokens(server) is wrapped  # once
    # agents not turned on (the server's authorizer does not apply their scopes): nothing changes
    plain = ServerApp()
    plain.identity_provider = IdentityProvider()
    kept = plain.identity_provider
    assert adopt_agent_tokens(plain) is None and plain.identity_provider is kept


def test_a_named_server_has_its_own_token_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JUPYTERHUB_SERVER_NAME", raising=False)
    assert _per_server("agent_tokens.db") == "agent_tokens.db"
    monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", "")  # the default server
    assert _per_server("agent_tokens.db") == "agent_tokens.db"
    names = set()
    for server in ("lab2", "lab 2", "lab_2", "../x", "é" * 100):
        monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", server)
        name = _per_server("agent_tokens.db")
        assert "/" not in name and name.startswith("agent_tokens.") and name.endswith(".db")
        assert len(name) < 100
        names.add(name)
    assert len(names) == 5  # names that look alike once made safe still differ
