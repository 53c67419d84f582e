"""``/api/agent/tokens``: create, list and revoke agent tokens (``read``/``write`` on ``agent_tokens``).

Only the server's own credentials manage tokens (its token, a password login, a hub user on their own
server): an agent token is refused here whatever its scopes, by ``AgentAuthorizer`` (no scope grants
``agent_tokens``) and again by the route itself. Without ``AgentIdentityProvider`` the routes answer 409
saying how to enable agent tokens.
"""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..auth.identity import AGENT_PREFIX, AgentTokens, AgentUser
from ..auth.store import TokenStore, creation_warnings
from ..errors import AgentToolsError, Conflict
from ..validation import check
from .base import AgentAPIHandler

NOT_ENABLED = (
    "Agent tokens are not enabled on this server: add these two lines to its jupyter_server_config.py "
    "and restart it (docs/admin.md): c.ServerApp.identity_provider_class = "
    '"jupyter_agent_tools.auth.AgentIdentityProvider" and c.ServerApp.authorizer_class = '
    '"jupyter_agent_tools.auth.AgentAuthorizer".'
)


class _TokenRoute(AgentAPIHandler):
    auth_resource = "agent_tokens"

    @property
    def agents(self) -> AgentTokens:
        if isinstance(self.current_user, AgentUser):
            raise AgentToolsError(
                "Agent tokens cannot manage agent tokens: use the server's own token or log in.", 403
            )
        provider = self.identity_provider
        if not isinstance(provider, AgentTokens):
            raise Conflict(NOT_ENABLED)
        return provider

    @property
    def tokens(self) -> TokenStore:
        return self.agents.tokens


class TokenListHandler(_TokenRoute):
    """GET lists the tokens (never the tokens themselves); POST creates one and shows it once."""

    route_name = "tokens"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        store = self.tokens
        now = store.now()
        cap = self.agents.max_token_lifetime or None  # what the panel's form offers
        await self.write_json(
            {"tokens": [record.public(now) for record in store.tokens()], "max_lifetime": cap}
        )

    @web.authenticated
    @authorized("write")
    async def post(self) -> None:
        store = self.tokens
        body = await self.json_body()
        check("AgentTokenRequest", body)
        token, record = await store.call(
            store.create,
            body["name"],
            body["scopes"],
            body.get("paths") or (),
            self.agents.lifetime(body.get("expires_in")),
            body.get("ask") or (),
        )
        self.log.info("agent token %r created (scopes %s)", record.name, ",".join(sorted(record.scopes)))
        user = AGENT_PREFIX + record.name
        executes_unasked = self.approval_policy.decision(user, "execute", None, record.ask) == "allow"
        answer = {
            **record.public(store.now()),
            "token": token,
            "user": user,
            "warnings": creation_warnings(record, executes_unasked),
        }
        await self.write_json(answer, status=201)


class TokenHandler(_TokenRoute):
    """DELETE revokes the token of that name (it answers 403 'revoked' from then on) and ends what it
    started (its websockets, approval requests and grants, detached runs)."""

    route_name = "token"

    @web.authenticated
    @authorized("write")
    async def delete(self, name: str) -> None:
        record = await self.agents.revoke(name)
        self.log.info("agent token %r revoked", record.name)
        await self.write_json(record.public(self.tokens.now()))
