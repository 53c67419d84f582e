"""A simulated JupyterLab client of a jupyter-collaboration room, for the RTC tests.

It does what JupyterLab's document provider does: ``PUT /api/collaboration/session/{path}`` for the
room's file id and session, then the y-websocket sync protocol (pycrdt's ``Provider``) on
``/api/collaboration/room/json:notebook:{file_id}``, into a ``jupyter_ydoc.YNotebook`` of its own.
Changes the test makes to ``client.notebook`` travel to the server like a person's typing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tornado.httpclient
import tornado.websocket


def collaboration_config(jp_root_dir: Path, save_delay: float | None = 0.2) -> dict[str, Any]:
    """A test server's config with real-time collaboration: this extension, jupyter_server_ydoc and
    jupyter_server_fileid, their stores in a directory of the test's own, saves and file polls fast."""
    state = jp_root_dir.parent / "rtc-state"
    state.mkdir(exist_ok=True)
    return {
        "ServerApp": {
            "jpserver_extensions": {
                "jupyter_agent_tools": True,
                "jupyter_server_ydoc": True,
                "jupyter_server_fileid": True,
            }
        },
        "YDocExtension": {
            "document_save_delay": save_delay,
            "file_poll_interval": 0.2,
            "session_store_path": str(state / "sessions.json"),
        },
        "SQLiteYStore": {"db_path": str(state / "ystore.db")},
        "BaseFileIdManager": {"db_path": str(state / "fileid.db")},
    }


@pytest.fixture
def connect(
    jp_fetch: Any, jp_http_port: int, jp_base_url: str, jp_auth_header: Any, jp_asyncio_loop: Any
) -> Iterator[Callable[[str], Awaitable[RoomClient]]]:
    """Open the notebook in a simulated JupyterLab client; clients close before the server stops.
    (conftest.py registers this module as a plugin for it.)"""
    clients: list[RoomClient] = []

    async def _connect(path: str) -> RoomClient:
        client = await RoomClient.connect(jp_fetch, jp_http_port, jp_base_url, jp_auth_header, path)
        clients.append(client)
        return client

    yield _connect
    for client in clients:
        jp_asyncio_loop.run_until_complete(client.close())


async def until(predicate: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class TornadoChannel:
    """pycrdt's ``Channel`` protocol over a Tornado websocket client connection."""

    def __init__(self, ws: tornado.websocket.WebSocketClientConnection, path: str):
        self._ws = ws
        self._path = path

    @property
    def path(self) -> str:
        return self._path

    def __aiter__(self) -> TornadoChannel:
        return self

    async def __anext__(self) -> bytes:
        message = await self._ws.read_message()
        if message is None:
            raise StopAsyncIteration
        return message if isinstance(message, bytes) else message.encode()

    async def recv(self) -> bytes:
        return await self.__anext__()

    async def send(self, message: bytes) -> None:
        await self._ws.write_message(message, binary=True)


class RoomClient:
    """One collaborator with the notebook open: ``await RoomClient.connect(...)``, then ``close()``."""

    def __init__(self, notebook: Any, provider: Any, task: asyncio.Task, ws: Any, room_id: str, file_id: str):
        self.notebook = notebook
        self.provider = provider
        self.task = task
        self.ws = ws
        self.room_id = room_id
        self.file_id = file_id

    @classmethod
    async def connect(cls, jp_fetch: Any, port: int, base_url: str, headers: dict[str, str], path: str):
        from jupyter_ydoc import YNotebook
        from pycrdt import Doc, Provider

        response = await jp_fetch(
            "api",
            "collaboration",
            "session",
            path,
            method="PUT",
            body=json.dumps({"format": "json", "type": "notebook"}),
        )
        session = json.loads(response.body)
        room_id = f"{session['format']}:{session['type']}:{session['fileId']}"
        url = f"ws://127.0.0.1:{port}{base_url}api/collaboration/room/{room_id}?sessionId={session['sessionId']}"
        request = tornado.httpclient.HTTPRequest(url, headers=dict(headers))
        ws = await tornado.websocket.websocket_connect(request)
        doc = Doc()
        notebook = YNotebook(doc)
        provider = Provider(doc, TornadoChannel(ws, room_id))
        # The provider runs in a task of its own, so that any task may stop it.
        task = asyncio.create_task(provider.start())
        await provider.started.wait()
        client = cls(notebook, provider, task, ws, room_id, session["fileId"])
        await until(lambda: provider.synced.is_set() and len(notebook.ycells) > 0, "the room to sync")
        return client

    def type_at_end(self, index: int, text: str) -> None:
        """Append ``text`` to a cell's source, as a person typing at its end."""
        source = self.notebook.ycells[index]["source"]
        source += text

    def sources(self) -> list[str]:
        return [str(ycell["source"]) for ycell in self.notebook.ycells]

    def cell_ids(self) -> list[str]:
        return [ycell["id"] for ycell in self.notebook.ycells]

    async def close(self) -> None:
        try:
            await self.provider.stop()
            await asyncio.wait_for(self.task, 5)
        finally:
            self.ws.close()
