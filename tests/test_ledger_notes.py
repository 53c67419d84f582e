"""What the ledger tells a caller about a change it cannot undo or did not record (issue 35), through
every door: HTTP, MCP and the CLI's output. A real server, a real SQLite ledger, a real CLI process.

- A change that changed nothing (clear_outputs of a notebook without outputs) is not recorded: the
  panel offered an Undo of nothing. Creating a notebook, even an empty one, is recorded: the file is new.
- An edit of a notebook without cell ids (nbformat 4.4) cannot be undone: the answer says so
  (``undoable: false``) and how to give the cells ids (``upgrade``), which then works.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from contract import Contract
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_agent_tools.api_document import openapi_document

pytestmark = pytest.mark.timeout(180)
CONTRACT = Contract(openapi_document())
NB = "/api/agent/notebooks/{path}"


@pytest.fixture
def jp_server_config(jp_root_dir: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "Ledger": {"db_path": str(jp_root_dir.parent / "ledger" / "ledger.db")},
    }


def write_44(root: Path, name: str) -> Path:
    """A notebook as nbformat 4.4 wrote it: cells without ids."""
    nb = new_notebook(cells=[new_code_cell("a = 1"), new_code_cell("b = 2")])
    nb.nbformat_minor = 4
    for cell in nb.cells:
        del cell["id"]
    path = root / name
    nbformat.write(nb, str(path))
    return path


async def test_a_change_of_nothing_is_not_recorded_but_a_new_empty_notebook_is(jp_root_dir, api):
    nb = new_notebook(cells=[new_code_cell("a = 1", id="one")])
    nbformat.write(nb, str(jp_root_dir / "plain.ipynb"))
    status, cleared = await api(
        "POST", "notebooks", "plain.ipynb", body={"action": "clear_outputs", "all": True}
    )
    CONTRACT.assert_response("POST", NB, status, cleared)
    assert cleared["recorded"] is False and cleared["change_id"] is None
    assert "Nothing changed" in cleared["note"] and cleared["note"] in cleared["message"]
    status, created = await api("POST", "notebooks", "empty.ipynb", body={"action": "create"})
    assert status == 201 and created["recorded"] is True and created["undoable"] is False
    status, listing = await api("GET", "changes")
    assert [(c["path"], c["kind"], c["undoable"]) for c in listing["changes"]] == [
        ("empty.ipynb", "create", False)
    ]


async def test_an_edit_that_cannot_be_undone_says_so_and_how_to_fix_it(
    jp_root_dir, api, jp_fetch, jp_serverapp, jp_http_port, jp_base_url
):
    write_44(jp_root_dir, "old.ipynb")
    status, edited = await api(
        "POST", "notebooks", "old.ipynb", body={"action": "edit", "cell_index": 0, "content": "a = 10"}
    )
    CONTRACT.assert_response("POST", NB, status, edited)
    assert edited["recorded"] is True and edited["undoable"] is False
    assert "cannot be undone" in edited["note"] and '"upgrade": true' in edited["note"]
    assert edited["note"] in edited["message"]

    # MCP: the tool's text says it
    async def mcp(message: dict[str, Any], session: dict[str, str]) -> Any:
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        response = await jp_fetch(
            "api", "agent", "mcp", method="POST", body=json.dumps(message), headers={**headers, **session}
        )
        return response

    opened = await mcp(
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-03-26"}}, {}
    )
    session = {"Mcp-Session-Id": opened.headers["Mcp-Session-Id"]}
    await mcp({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    arguments = {"path": "old.ipynb", "action": "edit", "cell_index": 1, "content": "b = 20"}
    call = {"name": "notebook_edit", "arguments": arguments}
    response = await mcp({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}, session)
    text = json.loads(response.body)["result"]["content"][0]["text"]
    assert "cannot be undone" in text and "upgrade" in text, text

    # the CLI's output says it
    token = jp_serverapp.identity_provider.token
    env = {"JUPYTER_AGENT_URL": f"http://localhost:{jp_http_port}{jp_base_url}", "JUPYTER_AGENT_TOKEN": token}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jupyter_agent_tools.cli",
        "nb",
        "edit",
        "old.ipynb",
        "--cell",
        "0",
        "--content",
        "a = 11",
        env={**__import__("os").environ, **env, "TERM": "dumb"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err
    assert "cannot be undone" in out.decode() and "--upgrade" in out.decode(), out

    # the fix it names works: the cells get ids, and the next change can be undone
    status, upgraded = await api(
        "POST",
        "notebooks",
        "old.ipynb",
        body={"action": "edit", "cell_index": 0, "content": "a = 12", "upgrade": True},
    )
    assert status == 200 and upgraded["upgraded_from"] == "4.4", upgraded
    assert all(c.get("id") for c in nbformat.read(str(jp_root_dir / "old.ipynb"), as_version=4).cells)
    status, later = await api(
        "POST", "notebooks", "old.ipynb", body={"action": "edit", "cell_index": 1, "content": "b = 30"}
    )
    assert later["undoable"] is True and "note" not in later
    status, undone = await api("POST", "notebooks", "old.ipynb", "changes", later["change_id"], "undo")
    assert status == 200, undone
