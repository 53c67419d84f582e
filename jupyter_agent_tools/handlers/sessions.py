"""``/api/agent/sessions``: list, shut down and interrupt eval sessions; artifacts of their output."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import NotFound
from ..eval.service import EvalService
from .base import AgentAPIHandler


class _EvalRoute(AgentAPIHandler):
    auth_resource = "kernels"

    @property
    def service(self) -> EvalService:
        return self.extensionapp.eval_service  # type: ignore[attr-defined,no-any-return]


class SessionListHandler(_EvalRoute):
    """GET lists the sessions (``execute`` on ``kernels``)."""

    @web.authenticated
    @authorized("execute")
    async def get(self) -> None:
        self.write_json(
            {
                "sessions": self.service.list_sessions(),
                "totals": dict(self.service.sessions.totals),
            }
        )


class SessionHandler(_EvalRoute):
    """DELETE shuts a session and its kernel down."""

    @web.authenticated
    @authorized("execute")
    async def delete(self, name: str) -> None:
        session = await self.service.sessions.remove(name)
        if session is None:
            raise NotFound(f"Session not found: {name}")
        self.set_status(204)
        self.finish()


class SessionInterruptHandler(_EvalRoute):
    """POST interrupts what the session is running (the running call answers ``cancelled``)."""

    @web.authenticated
    @authorized("execute")
    async def post(self, name: str) -> None:
        session = self.service.sessions.get(name)
        if session is None:
            raise NotFound(f"Session not found: {name}")
        running = session.cancel is not None and not session.cancel.is_set()
        if running and session.cancel is not None:
            session.cancel.set()
        elif session.kernel_id:
            await self.service.kernels.interrupt(session.kernel_id)
        self.write_json({"session": name, "kernel_id": session.kernel_id, "interrupted": running})


class ArtifactHandler(_EvalRoute):
    """GET returns an artifact's full text (``read`` on ``kernels``)."""

    @web.authenticated
    @authorized("read")
    async def get(self, artifact_id: str) -> None:
        path = self.service.artifacts.path(artifact_id)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                self.write(chunk)
                await self.flush()
        self.finish()
