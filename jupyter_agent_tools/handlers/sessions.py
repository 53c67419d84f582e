"""``/api/agent/sessions``: list, shut down and interrupt eval sessions."""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..approvals.actions import describe_session_delete
from ..approvals.gate import query_wait
from ..execution.eval_service import EvalService
from .base import AgentAPIHandler


class _EvalRoute(AgentAPIHandler):
    auth_resource = "kernels"

    @property
    def service(self) -> EvalService:
        return self.app.eval_service

    @property
    def owner(self) -> str | None:
        """``?owner=``: whose session of that name (names are per identity; default: the caller's own,
        else the only one the caller may see)."""
        return self.get_query_argument("owner", None) or None


class SessionListHandler(_EvalRoute):
    """GET lists the sessions (``read`` on ``kernels``, as jupyter_server's kernel list)."""

    route_name = "sessions"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        await self.write_json(await self.service.listing_with_notebooks())


class SessionHandler(_EvalRoute):
    """DELETE shuts a session and its kernel down."""

    route_name = "session"

    @web.authenticated
    @authorized("execute")
    async def delete(self, name: str) -> None:
        owner = self.owner

        async def apply(_body: Any) -> tuple[None, int]:
            await self.service.delete_session(name, owner)
            return None, 204

        # a DELETE has no body: the gate's wait comes as ?approval_wait=SECONDS
        gate_body = query_wait(self.get_query_argument("approval_wait", None))
        await self.respond_gated("kernel", None, describe_session_delete(name), gate_body, apply)


class SessionInterruptHandler(_EvalRoute):
    """POST interrupts what the session is running (the running call answers ``cancelled``)."""

    route_name = "session_interrupt"

    @web.authenticated
    @authorized("execute")
    async def post(self, name: str) -> None:
        await self.write_json(await self.service.interrupt_session(name, self.owner))
