"""``/api/agent/mcp``: the MCP Streamable HTTP transport over the protocol core (:mod:`..mcp.server`).

Authentication is the server's own (token, or a logged-in browser session with XSRF on POST and
DELETE); each tool asks the server's authorizer for the permission of the route it wraps. A client that
disconnects while a call runs cancels it, as closing the NDJSON eval stream does.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from ..auth.identity import AgentTokens, AgentUser
from ..auth.scopes import needed
from ..auth.store import TOKEN_PREFIX
from ..body import encode_answer
from ..errors import AgentToolsError
from ..mcp.server import Answer, HttpRequest, McpServer
from ..oauth.core import OAUTH_NAME_PREFIX, SCOPES, challenge
from .base import NO_CREDENTIALS, AgentAPIHandler, acting_username
from .oauth import Urls

SSE = "text/event-stream"


class McpHandler(AgentAPIHandler):
    """POST takes JSON-RPC messages; GET opens a legacy session's stream of updates (its resource
    subscriptions); DELETE ends a session."""

    route_name = "mcp"
    via = "mcp"

    _cancel: asyncio.Event | None = None
    _challenge: str | None = None  # WWW-Authenticate of an error answer (Tornado clears headers first)

    @property
    def mcp(self) -> McpServer:
        return self.app.mcp_server

    async def prepare(self) -> None:  # type: ignore[override]
        """As every agent route; with OAuth sign-in on, a request that sent no credentials at all is
        answered 401 with the challenge that starts an MCP client's sign-in (RFC 9728)."""
        try:
            await super().prepare()
        except web.HTTPError as e:
            if e.status_code == 403 and self._oauth_on() and self._sent_nothing():
                self._challenge = challenge(Urls(self).resource_metadata, SCOPES)
                raise web.HTTPError(
                    401,
                    NO_CREDENTIALS + " Or sign in: MCP clients that support OAuth start a browser sign-in "
                    "from this answer (docs/mcp.md, 'Sign in with OAuth').",
                ) from None
            if e.status_code == 403 and self._oauth_on() and self._signed_in_token_ended():
                # RFC 6750: an ended access token is invalid_token (401), which sends its client back to
                # sign-in; agent tokens that were not signed in for keep the 403 that says what ended
                self._challenge = challenge(
                    Urls(self).resource_metadata, SCOPES, "invalid_token", e.log_message or ""
                )
                raise web.HTTPError(401, e.log_message) from None
            raise

    def _signed_in_token_ended(self) -> bool:
        """Whether the request's token is an access token issued through OAuth sign-in that expired or
        was revoked."""
        if getattr(self, "_signed_token_refused", False):  # signed by the hub's service, and refused
            return True
        provider = self.identity_provider
        token = provider.get_token(self) or ""
        if not isinstance(provider, AgentTokens) or not token.startswith(TOKEN_PREFIX):
            return False
        try:
            record = provider.tokens.lookup(token)
        except AgentToolsError:
            return False
        return (
            record is not None
            and record.name.startswith(OAUTH_NAME_PREFIX)
            and record.status(provider.tokens.now()) != "active"
        )

    def _oauth_on(self) -> bool:
        signin = getattr(self.app, "oauth", None)
        return bool(signin is not None and (signin.active or signin.hub_issuer))

    def _client_of(self, user: Any) -> str | None:
        """The app an agent's access token was issued to through OAuth sign-in (here, or by the hub's
        service), else None."""
        if not isinstance(user, AgentUser):
            return None
        client = self.app.oauth.client_of(user.token_id)
        provider = self.identity_provider
        if client is None and isinstance(provider, AgentTokens) and provider.hub_tokens.enabled:
            client = provider.hub_tokens.client_of(user.token_id)
        return client

    def _sent_nothing(self) -> bool:
        """No credentials at all: no Authorization header, no token parameter, no login cookie."""
        if self.request.headers.get("Authorization") or self.get_argument("token", ""):
            return False
        cookie_name = getattr(self.identity_provider, "get_cookie_name", None)
        name = cookie_name(self) if callable(cookie_name) else ""
        return not (name and self.get_cookie(name))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        if self._challenge is not None:
            self.set_header("WWW-Authenticate", self._challenge)
            self.set_header("Access-Control-Expose-Headers", "Mcp-Session-Id, WWW-Authenticate")
        super().write_error(status_code, **kwargs)

    def _scope_challenge(self, permissions: list[tuple[str, str]]) -> str | None:
        """The ``insufficient_scope`` challenge for an OAuth-issued token that lacks a scope these
        permissions need (its client can sign in again for more, a step-up); None otherwise."""
        user = self.current_user
        if not isinstance(user, AgentUser) or not self._oauth_on() or self._client_of(user) is None:
            return None
        scopes = (needed(resource, action) for action, resource in permissions)
        missing = {s for s in scopes if s is not None} - set(user.scopes)
        if not missing:
            return None
        wanted = missing | (set(user.scopes) & set(SCOPES))
        problem = f"this needs the {', '.join(sorted(missing))} scope"
        return challenge(Urls(self).resource_metadata, wanted, "insufficient_scope", problem)

    def check_origin(self, origin_to_satisfy_tornado: str = "") -> bool:
        # The MCP transport answers a foreign Origin with 403 (Jupyter's API handlers answer 404).
        if not super().check_origin(origin_to_satisfy_tornado):
            raise web.HTTPError(
                403, "Cross-origin request refused (the server's allow_origin does not list it)"
            )
        return True

    def on_connection_close(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
        super().on_connection_close()

    def _request(self) -> HttpRequest:
        headers: dict[str, list[str]] = {}
        for name, value in self.request.headers.get_all():
            headers.setdefault(name.lower(), []).append(value)

        async def authorize(action: str, resource: str) -> bool:
            user = self.current_user
            try:
                return bool(await ensure_async(self.authorizer.is_authorized(self, user, action, resource)))
            except web.HTTPError as e:  # AgentAuthorizer's refusal of an agent token, naming the scope
                if e.status_code in (403, 404):
                    raise AgentToolsError(e.log_message or "Permission denied", e.status_code) from None
                raise

        user = self.current_user
        return HttpRequest(
            headers,
            self._owner(),
            authorize,
            identity=acting_username(self) or "",
            agent=user.agent if isinstance(user, AgentUser) else None,
            token_ask=getattr(user, "ask", frozenset()),
            lab_url=f"{self.request.protocol}://{self.request.host}{url_path_join(self.base_url, 'lab')}",
            scope_challenge=self._scope_challenge,
        )

    def _owner(self) -> str:
        """The identity a legacy session belongs to (and is counted against per identity): the token a
        request was authenticated with, hashed (jupyter_server gives such a request a new anonymous user
        each time; the token as jupyter_server read it, so ``Token x`` and ``bearer x`` are one
        identity), else the logged-in user (a login cookie, JupyterHub). An app signed in through OAuth is
        its client: its access tokens change hourly and with a step-up, its sessions stay its own."""
        user = self.current_user
        client = self._client_of(user)
        if client is not None:  # a signed-in app renews its token hourly, or signs in again for more scopes
            return "oauth:" + client
        if self.token_authenticated:
            token = self.identity_provider.get_token(self) or ""
            return "token:" + hashlib.sha256(token.encode()).hexdigest()
        return "user:" + self.current_user.username

    @web.authenticated
    async def post(self) -> None:
        try:
            body = await self.json_body()
        except AgentToolsError as e:
            await self._send(self.mcp.body_error(e.status, e.message))
            return
        await self._send(await self.mcp.post(body, self._request()))

    @web.authenticated
    async def get(self) -> None:
        await self._send(self.mcp.get(self._request()))

    @web.authenticated
    async def delete(self) -> None:
        await self._send(self.mcp.delete(self._request()))

    async def _send(self, answer: Answer) -> None:
        self.set_header("Access-Control-Expose-Headers", "Mcp-Session-Id, WWW-Authenticate")
        for name, value in answer.headers.items():
            self.set_header(name, value)
        if answer.stream is None:
            await self._finish_json(answer.status, answer.body)
            return
        self._cancel = answer.cancel
        streaming = False
        try:
            async for item in answer.stream:
                if item.final and not streaming:
                    await self._finish_json(item.status, item.message)
                    return
                if not self.accepts_sse:
                    continue  # a client without SSE gets the response alone, when it is ready
                if not streaming:
                    streaming = True
                    self.set_status(200)
                    self.set_header("Content-Type", SSE)
                    self.set_header("Cache-Control", "no-cache, no-transform")
                    self.set_header("X-Accel-Buffering", "no")
                if item.message is None:
                    self.write(": keep-alive\n\n")
                else:
                    self.write(f"event: message\ndata: {await encode_answer(item.message)}\n\n")
                await self.flush()
            if not streaming:  # cancelled by the client before anything was sent: an empty stream
                self.set_status(200)
            self.finish(set_content_type=SSE)
        except StreamClosedError:
            if answer.cancel is not None:
                answer.cancel.set()
        finally:
            await answer.stream.aclose()  # type: ignore[attr-defined]

    @property
    def accepts_sse(self) -> bool:
        return SSE in self.request.headers.get("Accept", "")

    async def _finish_json(self, status: int, body: Any) -> None:
        if body is None:
            self.set_status(status)
            self.finish()
        elif isinstance(body, bytes):  # encoded by the core (a batch's answers, each measured)
            self.set_status(status)
            self.finish(body)
        else:
            await self.write_json(body, status)
