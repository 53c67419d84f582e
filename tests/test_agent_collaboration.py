"""Agent tokens in jupyter-collaboration's rooms: writing through a room needs ``edit`` on its file.

A real server with jupyter_server_ydoc and the file id service next to the extension, the two documented
lines, and a real Yjs client (``rtc_client.RoomClient``, pycrdt's provider) on the room websocket. The
room applies every Yjs update it receives, so ``read`` there would be write access: a ``read`` token's
blind update must not reach the file, a token whose paths do not hold the file is told the room does not
exist (without its path), and an ``edit`` token inside its paths still collaborates.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
import tornado.httpclient
import tornado.websocket
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_agent_tools.auth import AgentAuthorizer, AgentIdentityProvider

pytest.importorskip("jupyter_server_ydoc", reason="jupyter-collaboration is not installed")

from rtc_client import RoomClient, collaboration_config, until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def jp_server_config(jp_root_dir: Path) -> dict[str, Any]:
    config = collaboration_config(jp_root_dir)
    config["ServerApp"].update(
        identity_provider_class=AgentIdentityProvider, authorizer_class=AgentAuthorizer
    )
    return {**config, "KernelPool": {"size": 0}}


def _write(path: Path, *sources: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cells = [new_code_cell(s, id=f"c{i}") for i, s in enumerate(sources)]
    nbformat.write(new_notebook(cells=cells), str(path))


def _blind_insert() -> bytes:
    """A y-websocket update message inserting a cell, made without knowing the room's state."""
    from jupyter_ydoc import YNotebook
    from pycrdt import Doc, create_update_message

    doc = Doc()
    notebook = YNotebook(doc)
    notebook.append_cell({"cell_type": "code", "source": "print('blind')", "metadata": {}, "outputs": []})
    return create_update_message(doc.get_update())


async def _room_socket(port: int, base_url: str, room: str, token: str, session: str = "") -> Any:
    """The room websocket opened with ``token`` (``sessionId`` optional), or the status refusing it."""
    query = f"?sessionId={session}" if session else ""
    url = f"ws://127.0.0.1:{port}{base_url}api/collaboration/room/{room}{query}"
    request = tornado.httpclient.HTTPRequest(url, headers={"Authorization": f"token {token}"})
    try:
        return await tornado.websocket.websocket_connect(request)
    except tornado.httpclient.HTTPClientError as e:
        return e.code


async def test_writing_through_a_room_needs_edit_within_the_paths(
    http, jp_fetch, jp_http_port, jp_base_url, jp_root_dir: Path, jp_serverapp
) -> None:
    inside, outside = jp_root_dir / "sub" / "n.ipynb", jp_root_dir / "other.ipynb"
    _write(inside, "a = 1")
    _write(outside, "secret = 1")
    tokens = {}
    for name, scopes, paths in [
        ("reader", ["read"], None),
        ("editor", ["edit"], ["sub/**"]),
        ("stranger", ["edit"], ["elsewhere/**"]),
    ]:
        body: dict[str, Any] = {"name": name, "scopes": scopes, **({"paths": paths} if paths else {})}
        status, made = await http("POST", "api/agent/tokens", body)
        assert status == 201, made
        tokens[name] = made["token"]
    rooms = {}
    for path in ("sub/n.ipynb", "other.ipynb"):
        status, session = await http(
            "PUT", f"api/collaboration/session/{path}", {"format": "json", "type": "notebook"}
        )
        assert status in (200, 201), session
        rooms[path] = (f"json:notebook:{session['fileId']}", session["sessionId"])
    before = {p: p.read_bytes() for p in (inside, outside)}

    # a read token: refused at the handshake, saying the edit scope is missing; its blind update (with
    # and without the session id, as the attack sent it) never reaches a file
    for path, (room, session) in rooms.items():
        for session_id in ("", session):
            ws = await _room_socket(jp_http_port, jp_base_url, room, tokens["reader"], session_id)
            if not isinstance(ws, int):
                await ws.write_message(_blind_insert(), binary=True)
                await asyncio.sleep(0.5)
                ws.close()
            assert ws == 403, (path, session_id, ws)
    status, answer = await http("PUT", "api/collaboration/session/sub/n.ipynb", {}, token=tokens["reader"])
    assert status == 403 and "'edit' scope" in answer["message"], answer
    # an edit token whose paths do not hold the file: no such room, and its path is not told
    ws = await _room_socket(jp_http_port, jp_base_url, rooms["other.ipynb"][0], tokens["editor"])
    assert ws == 404, ws
    ws = await _room_socket(jp_http_port, jp_base_url, rooms["sub/n.ipynb"][0], tokens["stranger"])
    assert ws == 404, ws
    status, answer = await http(
        "PUT",
        "api/collaboration/undo_redo/" + rooms["other.ipynb"][0],
        {"action": "undo"},
        token=tokens["editor"],
    )
    assert status == 404 and "other.ipynb" not in json.dumps(answer), answer
    for route in ("api/collaboration/session/other.ipynb", "api/collaboration/timeline/other.ipynb"):
        method = "PUT" if "session" in route else "GET"
        status, answer = await http(method, route, {} if method == "PUT" else None, token=tokens["editor"])
        assert status == 404, (route, status, answer)
    status, answer = await http(
        "PUT", "api/collaboration/fork/" + rooms["sub/n.ipynb"][0], {}, token=tokens["editor"]
    )
    assert status == 403 and "fork" in answer["message"], answer
    # a room that is no document's (awareness): not an agent's
    ws = await _room_socket(jp_http_port, jp_base_url, "JupyterLab:globalAwareness", tokens["editor"])
    assert ws == 403, ws
    await asyncio.sleep(1)  # longer than the rooms' save delay: nothing was saved
    assert {p: p.read_bytes() for p in (inside, outside)} == before

    # an edit token inside its paths collaborates as a person does
    client = await RoomClient.connect(
        jp_fetch, jp_http_port, jp_base_url, {"Authorization": f"token {tokens['editor']}"}, "sub/n.ipynb"
    )
    try:
        client.type_at_end(0, " + 1")
        await until(lambda: "a = 1 + 1" in inside.read_text(), "the room to save the agent's typing")
        # revoked, its room websocket is closed: what it types afterwards reaches nothing
        status, answer = await http("DELETE", "api/agent/tokens/editor")
        assert status == 200, answer
        await until(lambda: client.ws.close_code is not None, "the server to close the revoked room socket")
        assert client.ws.close_code == 1008, client.ws.close_code
        client.type_at_end(0, " + 2")
        await asyncio.sleep(1)
        assert "a = 1 + 1 + 2" not in inside.read_text()
    finally:
        with contextlib.suppress(Exception):  # the provider's task ends with the closed socket's error
            await client.close()
    assert outside.read_bytes() == before[outside]
