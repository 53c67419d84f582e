"""jupyter_server's kernel and session routes, as an agent may see them.

The same handlers, on the same URLs (an extension's routes are matched before the server's own), with
one difference for agent tokens: what belongs to someone else does not exist. A kernel or jupyter session
of a notebook outside the agent's paths, another agent's eval session's kernel, and a warm pool kernel
(which some later eval will take) are left out of ``GET /api/kernels`` and ``GET /api/sessions`` and
answer 404 on the routes that name them; a session cannot be created or moved to a path outside the
paths. Everyone else gets jupyter_server's answers unchanged.

The kernel websocket (``/api/kernels/{id}/channels``) refuses a hidden kernel the same way. A kernel
started through ``POST /api/kernels`` without a session has no owner: every agent with ``execute`` reaches
it (docs/admin.md says how to keep agents off these routes).
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_client.jsonutil import json_default
from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized
from jupyter_server.services.kernels.handlers import KernelActionHandler, KernelHandler, MainKernelHandler
from jupyter_server.services.kernels.websocket import KernelWebsocketHandler
from jupyter_server.services.sessions.handlers import SessionHandler, SessionRootHandler
from tornado import web

from ..auth.identity import AgentUser

KERNEL_ID = r"(?P<kernel_id>\w+-\w+-\w+-\w+-\w+)"
SESSION_ID = r"(?P<session_id>\w+-\w+-\w+-\w+-\w+)"


# Where the web application's settings hold this extension's app (ExtensionApp puts itself under its name;
# these handlers are jupyter_server's own, not ExtensionHandlerMixin's, whose ``config`` is the extension's).
EXTENSION = "jupyter_agent_tools"


class _AgentView:
    """What the agent of the request may see of kernels and sessions (nothing hidden for others)."""

    current_user: Any
    contents_manager: Any
    session_manager: Any
    request: Any
    settings: dict[str, Any]
    path_kwargs: dict[str, Any]

    @property
    def agent(self) -> AgentUser | None:
        user = self.current_user
        return user if isinstance(user, AgentUser) else None

    def path_visible(self, path: Any) -> bool:
        agent = self.agent
        if agent is None or agent.path_scope is None:
            return True
        root = getattr(self.contents_manager, "root_dir", None)
        return isinstance(path, str) and agent.path_scope.allows(path, root)

    async def hidden_kernels(self) -> set[str]:
        """Ids of the kernels the agent may not see: of sessions outside its paths, of other agents'
        eval sessions, of the warm pool."""
        agent = self.agent
        if agent is None:
            return set()
        hidden = set()
        for model in await ensure_async(self.session_manager.list_sessions()):
            kernel = (model.get("kernel") or {}).get("id")
            if kernel and not self.path_visible(model.get("path")):
                hidden.add(str(kernel))
        service = getattr(self.settings.get(EXTENSION), "eval_service", None)
        if service is not None:
            hidden |= service.sessions.kernels_of_others(agent.username)
            hidden |= set(service.pool.kernel_ids)
        return hidden

    async def prepare(self) -> None:
        await super().prepare()  # type: ignore[misc]
        if self.agent is None:
            return
        kernel_id = self.path_kwargs.get("kernel_id")
        if kernel_id and kernel_id in await self.hidden_kernels():
            raise web.HTTPError(404, f"Kernel does not exist: {kernel_id}")
        session_id = self.path_kwargs.get("session_id")
        if session_id:
            try:
                model = await self.session_manager.get_session(session_id=session_id)
            except web.HTTPError:
                return  # jupyter_server answers its own 404
            if not self.path_visible(model.get("path")) or str(model["kernel"]["id"]) in (
                await self.hidden_kernels()
            ):
                raise web.HTTPError(404, f"Session not found: session_id={session_id!r}")
        if self.request.method in ("POST", "PATCH") and self.request.body:
            try:
                body = json.loads(self.request.body)
            except ValueError:
                return  # jupyter_server answers the bad body
            path = body.get("path") if isinstance(body, dict) else None
            if isinstance(path, str) and not self.path_visible(path):
                raise web.HTTPError(404, f"No such file or directory: {path}")


class AgentKernelListHandler(_AgentView, MainKernelHandler):  # type: ignore[misc]
    """``GET /api/kernels`` without the kernels the agent may not see."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        hidden = await self.hidden_kernels()
        kernels = await ensure_async(self.kernel_manager.list_kernels())
        self.finish(json.dumps([k for k in kernels if k["id"] not in hidden], default=json_default))


class AgentKernelHandler(_AgentView, KernelHandler):  # type: ignore[misc]
    """``/api/kernels/{id}``: 404 for a kernel the agent may not see."""


class AgentKernelActionHandler(_AgentView, KernelActionHandler):  # type: ignore[misc]
    """``/api/kernels/{id}/{interrupt,restart}``: 404 for a kernel the agent may not see."""


class AgentKernelWebsocketHandler(_AgentView, KernelWebsocketHandler):  # type: ignore[misc]
    """``/api/kernels/{id}/channels``: 404 for a kernel the agent may not see (before the handshake)."""


class AgentSessionListHandler(_AgentView, SessionRootHandler):  # type: ignore[misc]
    """``GET /api/sessions`` without the sessions the agent may not see; no session created outside its
    paths."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        hidden = await self.hidden_kernels()
        sessions = await ensure_async(self.session_manager.list_sessions())
        shown = [
            s
            for s in sessions
            if self.path_visible(s.get("path")) and str((s.get("kernel") or {}).get("id")) not in hidden
        ]
        self.finish(json.dumps(shown, default=json_default))


class AgentSessionHandler(_AgentView, SessionHandler):  # type: ignore[misc]
    """``/api/sessions/{id}``: 404 for a session the agent may not see; not moved outside its paths."""


HANDLERS = [
    (r"/api/kernels", AgentKernelListHandler),
    (rf"/api/kernels/{KERNEL_ID}", AgentKernelHandler),
    (rf"/api/kernels/{KERNEL_ID}/(?P<action>restart|interrupt)", AgentKernelActionHandler),
    (rf"/api/kernels/{KERNEL_ID}/channels", AgentKernelWebsocketHandler),
    (r"/api/sessions", AgentSessionListHandler),
    (rf"/api/sessions/{SESSION_ID}", AgentSessionHandler),
]
