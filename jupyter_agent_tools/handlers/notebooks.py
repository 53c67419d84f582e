"""``/api/agent/notebooks/{path}``: read a notebook for an agent, change it cell by cell."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized
from tornado import web

from ..eval.notebook_run import NotebookRunner
from ..notebook.store import NotebookStore
from .base import AgentAPIHandler
from .eval import Emit, EvalHandler

TRUE_VALUES = ("1", "true", "yes", "on")


class NotebookHandler(AgentAPIHandler):
    """GET reads (``read`` on ``contents``); POST applies operations (``write`` on ``contents``)."""

    route_name = "notebook"

    auth_resource = "contents"

    @property
    def store(self) -> NotebookStore:
        return self.extensionapp.notebook_store  # type: ignore[attr-defined]

    @web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        flag = self.get_query_argument("include_binary", "false").lower()
        include_binary = flag in TRUE_VALUES
        self.write_json(await self.store.read(path, include_binary=include_binary))

    @web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        body = await self.json_body()
        self.write_json(await self.store.edit(path, body))


class NotebookRunHandler(EvalHandler):
    """POST runs the notebook's cells in its own kernel and writes their outputs back.

    Authorized as ``write`` on ``contents`` (the decorator) and ``execute`` on ``kernels`` (checked
    before anything runs); JSON or an NDJSON stream like eval, and closing the stream interrupts.
    """

    route_name = "notebook_run"

    auth_resource = "contents"
    _path = ""

    @property
    def runner(self) -> NotebookRunner:
        return self.extensionapp.notebook_runner  # type: ignore[attr-defined]

    def _call(self, body: Any, emit: Emit, cancel: asyncio.Event) -> Awaitable[dict[str, Any]]:
        return self.runner.run(self._path, body, emit=emit, cancel=cancel)

    @web.authenticated
    @authorized
    async def post(self, path: str = "") -> None:
        user = self.current_user
        if not await ensure_async(self.authorizer.is_authorized(self, user, "execute", "kernels")):
            raise web.HTTPError(
                403, "User is not authorized to execute on resource: kernels (running a notebook needs it)."
            )
        self._path = path
        await self._respond(await self.json_body())
