"""The change ledger's routes: list a notebook's changes (or every notebook's), show one, undo one."""

from __future__ import annotations

import functools
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..approvals.actions import describe_undo
from ..ledger.service import Ledger
from ..notebook.reading import query_int
from ..notebook.store import NotebookStore
from .base import AgentAPIHandler


class _LedgerHandler(AgentAPIHandler):
    auth_resource = "contents"

    @property
    def store(self) -> NotebookStore:
        return self.app.notebook_store

    @property
    def ledger(self) -> Ledger:
        return self.app.ledger

    def _query(self, name: str) -> str | None:
        return self.get_query_argument(name, default=None)


class NotebookChangesHandler(_LedgerHandler):
    """GET a notebook's changes, newest first (``read`` on ``contents``)."""

    route_name = "notebook_changes"

    @web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        limit = query_int("limit", self._query("limit"))
        await self.write_json(await self.store.changes(path, limit=limit, before=self._query("before")))


class NotebookChangeHandler(_LedgerHandler):
    """GET one change with its cells' before and after (``read`` on ``contents``)."""

    route_name = "notebook_change"

    @web.authenticated
    @authorized
    async def get(self, path: str, change_id: str) -> None:
        await self.write_json(await self.store.change_detail(path, change_id))


class NotebookUndoHandler(_LedgerHandler):
    """POST undoes one change (``write`` on ``contents``); the body is optional."""

    route_name = "notebook_undo"

    @web.authenticated
    @authorized
    async def post(self, path: str, change_id: str) -> None:
        gate_body = await self.json_body() if self.request.body.strip() else None

        async def apply(body: Any) -> tuple[dict[str, Any], int]:
            return await self.store.undo(path, change_id, body or None), 200

        describe = functools.partial(describe_undo, self.store, path, change_id)
        await self.respond_gated("edit", path, describe, gate_body, apply)


class ChangesHandler(_LedgerHandler):
    """GET the changes of every notebook, newest first (``read`` on ``contents``)."""

    route_name = "changes"

    @web.authenticated
    @authorized
    async def get(self) -> None:
        arg = functools.partial(self.get_query_argument, default=None)
        limit = query_int("limit", arg("limit"))
        await self.write_json(await self.ledger.recent(since=arg("since"), limit=limit))
