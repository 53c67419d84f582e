"""``/api/agent/notebooks/{path}``: read a notebook for an agent, change it cell by cell."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..notebook.store import NotebookStore
from .base import AgentAPIHandler

TRUE_VALUES = ("1", "true", "yes", "on")


class NotebookHandler(AgentAPIHandler):
    """GET reads (``read`` on ``contents``); POST applies operations (``write`` on ``contents``)."""

    auth_resource = "contents"

    @property
    def store(self) -> NotebookStore:
        return self.extensionapp.notebook_store  # type: ignore[attr-defined,no-any-return]

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
