"""``/api/agent/mcp``: the MCP Streamable HTTP transport over the protocol core (:mod:`..mcp.server`).

Authentication is the server's own (token, or a logged-in browser session with XSRF on POST and
DELETE); each tool asks the server's authorizer for the permission of the route it wraps. A client that
disconnects while a call runs cancels it, as closing the NDJSON eval stream does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from ..errors import AgentToolsError
from ..mcp.server import Answer, HttpRequest, McpServer
from .base import AgentAPIHandler, acting_username

SSE = "text/event-stream"


class McpHandler(AgentAPIHandler):
    """POST takes JSON-RPC messages; GET is 405 (no server-initiated stream); DELETE ends a session."""

    route_name = "mcp"
    via = "mcp"

    _cancel: asyncio.Event | None = None

    @property
    def mcp(self) -> McpServer:
        return self.app.mcp_server

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
            token_ask=getattr(user, "ask", frozenset()),
            lab_url=f"{self.request.protocol}://{self.request.host}{url_path_join(self.base_url, 'lab')}",
        )

    def _owner(self) -> str:
        """The identity a legacy session belongs to (and is counted against per identity): the token a
        request was authenticated with, hashed (jupyter_server gives such a request a new anonymous user
        each time; the token as jupyter_server read it, so ``Token x`` and ``bearer x`` are one
        identity), else the logged-in user (a login cookie, JupyterHub)."""
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
        self.set_header("Access-Control-Expose-Headers", "Mcp-Session-Id")
        for name, value in answer.headers.items():
            self.set_header(name, value)
        if answer.stream is None:
            self._finish_json(answer.status, answer.body)
            return
        self._cancel = answer.cancel
        streaming = False
        try:
            async for item in answer.stream:
                if item.final and not streaming:
                    self._finish_json(item.status, item.message)
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
                    self.write(f"event: message\ndata: {json.dumps(item.message, ensure_ascii=False)}\n\n")
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

    def _finish_json(self, status: int, body: Any) -> None:
        self.set_status(status)
        if body is None:
            self.finish()
        elif isinstance(body, bytes):  # encoded by the core (a batch's answers, each measured)
            self.finish(body)
        else:
            self.finish(json.dumps(body, ensure_ascii=False))
