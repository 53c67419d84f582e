"""A save through /api/contents that overwrites an agent's change is recorded (issue 37 item 4).

JupyterLab without real-time collaboration keeps its own copy of an open notebook; its save (or autosave,
or the Overwrite of its File Changed dialog) writes that copy over the file. The server, a real SQLite
ledger and real PUTs through jupyter_server's contents API: the save is recorded as an ``overwrite`` by
the saving identity (door ``contents``) naming the agent's changes and cells it dropped, told as a
``ledger_change`` event, named by a ``?since=`` read, and its undo brings the agent's cells back while the
person's own edits stay. Saves that touch no agent-changed cell are not recorded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from contract import Contract
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from jupyter_agent_tools.api_document import openapi_document

pytestmark = pytest.mark.timeout(180)
CONTRACT = Contract(openapi_document())
CHANGES = "/api/agent/notebooks/{path}/changes"


@pytest.fixture
def jp_server_config(jp_root_dir: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "Ledger": {"db_path": str(jp_root_dir.parent / "ledger" / "ledger.db")},
    }


def write(root: Path, name: str = "nb.ipynb") -> Path:
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Title", id="md"),
            new_code_cell("a = 1", id="one"),
            new_code_cell("b = 2", id="two"),
            new_code_cell("c = 3", id="three"),
        ]
    )
    nb.nbformat_minor = 5
    path = root / name
    nbformat.write(nb, str(path))
    return path


async def lab_copy(jp_fetch: Any, name: str = "nb.ipynb") -> dict[str, Any]:
    """The notebook as JupyterLab loads it (its own copy, kept while the file changes on disk)."""
    response = await jp_fetch("api", "contents", name, params={"type": "notebook", "content": "1"})
    return json.loads(response.body)["content"]


async def lab_save(jp_fetch: Any, nb: dict[str, Any], name: str = "nb.ipynb") -> None:
    """JupyterLab's save: PUT the whole notebook through the contents API."""
    body = json.dumps({"type": "notebook", "format": "json", "content": nb})
    response = await jp_fetch("api", "contents", name, method="PUT", body=body)
    assert response.code == 200


def cell(nb: dict[str, Any], cell_id: str) -> dict[str, Any]:
    return next(c for c in nb["cells"] if c["id"] == cell_id)


def sources(path: Path) -> dict[str, str]:
    return {c.id: c.source for c in nbformat.read(str(path), as_version=4).cells}


async def test_a_stale_save_over_an_agents_change_is_recorded_and_undone(
    jp_root_dir, api, jp_fetch, agent_audit_events
):
    path = write(jp_root_dir)
    stale = await lab_copy(jp_fetch)  # the person's open page
    status, edited = await api(
        "POST",
        "notebooks",
        "nb.ipynb",
        body={
            "ops": [
                {"action": "insert", "cell_index": 2, "content": "agent = True", "cell_id": "agentcell"},
                {"action": "edit", "cell_id": "two", "content": "b = 'agent'"},
            ]
        },
    )
    assert status == 200 and edited["recorded"] is True, edited
    cell(stale, "three")["source"] = "c = 'person'"  # the person's own edit in the stale copy
    await lab_save(jp_fetch, stale)  # "File Changed" -> Overwrite
    assert sources(path) == {"md": "# Title", "one": "a = 1", "two": "b = 2", "three": "c = 'person'"}

    status, listing = await api("GET", "notebooks", "nb.ipynb", "changes")
    CONTRACT.assert_response("GET", CHANGES, status, listing)
    overwrite = listing["changes"][0]
    assert overwrite["kind"] == "overwrite" and overwrite["via"] == "contents"
    assert overwrite["overwrites"] == [edited["change_id"]]
    assert overwrite["user"] == listing["changes"][1]["user"] and overwrite["user"]  # the saving identity
    assert overwrite["action"] == (
        f"save over change {edited['change_id']}: cells agentcell (deleted), two (edited)"
    )
    assert {c["id"]: c["what"] for c in overwrite["cells"]} == {"agentcell": ["deleted"], "two": ["edited"]}
    assert overwrite["undoable"] is True and listing["changes"][1]["overwrites"] is None
    [told] = [e for e in agent_audit_events("ledger_change") if e["kind"] == "overwrite"]
    assert told["change_id"] == overwrite["id"] and told["overwrites"] == [edited["change_id"]]

    # the agent reads what changed since its own edit: the cells the save overwrote, and by whom
    status, read = await api("GET", "notebooks", "nb.ipynb", params={"since": edited["hash"]})
    by_id = {c["id"]: c for c in read["changes_since"]["cells"]}
    assert by_id["agentcell"]["what"] == ["deleted"] and by_id["agentcell"]["change_id"] == overwrite["id"]
    assert by_id["two"]["change_id"] == overwrite["id"] and by_id["two"]["via"] == "contents"
    assert by_id["three"]["change_id"] is None  # the person's own edit: no recorded change explains it

    # undo of the overwrite: the agent's version of its cells, the person's edit kept
    status, undone = await api("POST", "notebooks", "nb.ipynb", "changes", overwrite["id"], "undo")
    assert status == 200, undone
    assert sources(path) == {
        "md": "# Title",
        "one": "a = 1",
        "agentcell": "agent = True",
        "two": "b = 'agent'",
        "three": "c = 'person'",
    }
    assert [c.id for c in nbformat.read(str(path), as_version=4).cells] == [
        "md",
        "one",
        "agentcell",
        "two",
        "three",
    ]


async def test_saves_that_touch_no_agent_cell_are_not_recorded(jp_root_dir, api, jp_fetch):
    write(jp_root_dir)
    status, _ = await api(
        "POST", "notebooks", "nb.ipynb", body={"action": "edit", "cell_id": "two", "content": "b = 'agent'"}
    )
    assert status == 200
    fresh = await lab_copy(jp_fetch)  # a page that follows the file: it has the agent's edit
    cell(fresh, "three")["source"] = "c = 'person'"
    cell(fresh, "one")["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
    await lab_save(jp_fetch, fresh)
    del fresh["cells"][0]  # the person deletes a cell no agent touched
    await lab_save(jp_fetch, fresh)
    write(jp_root_dir, "other.ipynb")  # a notebook without any recorded change
    other = await lab_copy(jp_fetch, "other.ipynb")
    other["cells"] = []
    await lab_save(jp_fetch, other, "other.ipynb")
    status, listing = await api("GET", "changes")
    assert [c["kind"] for c in listing["changes"]] == ["edit"]


async def test_an_undo_of_an_overwrite_checks_the_cells(jp_root_dir, api, jp_fetch):
    path = write(jp_root_dir)
    stale = await lab_copy(jp_fetch)
    status, _ = await api(
        "POST", "notebooks", "nb.ipynb", body={"action": "edit", "cell_id": "two", "content": "b = 'agent'"}
    )
    await lab_save(jp_fetch, stale)  # drops the agent's edit of two
    status, listing = await api("GET", "notebooks", "nb.ipynb", "changes")
    overwrite = listing["changes"][0]
    assert overwrite["kind"] == "overwrite"
    cell(stale, "two")["source"] = "b = 'person again'"
    await lab_save(jp_fetch, stale)  # the person changes that cell again: not an overwrite of the agent
    status, listing = await api("GET", "notebooks", "nb.ipynb", "changes")
    assert [c["kind"] for c in listing["changes"]] == ["overwrite", "edit"]
    before = path.read_bytes()
    status, error = await api("POST", "notebooks", "nb.ipynb", "changes", overwrite["id"], "undo")
    assert status == 409 and "cell two: its source changed since" in error["message"]
    assert path.read_bytes() == before


async def test_saves_of_a_1_mb_notebook_that_keep_the_agents_cells_are_not_recorded(
    jp_root_dir, api, jp_serverapp
):
    """Saves through the contents API's path of a 1 MB notebook an agent changed (the file read before and
    after each save), and of one no recorded change touched (one look-up in memory), that keep the agent's
    cells record nothing. (What such a save costs is measured, not asserted: the ledger's notes.)"""
    nb = new_notebook(cells=[new_code_cell(f"x = {i}\n# " + "y" * 1000, id=f"c{i}") for i in range(1000)])
    nb.nbformat_minor = 5
    for name in ("plain.ipynb", "big.ipynb"):
        nbformat.write(nb, str(jp_root_dir / name))
    assert (jp_root_dir / "big.ipynb").stat().st_size > 1_000_000
    status, _ = await api(
        "POST", "notebooks", "big.ipynb", body={"action": "edit", "cell_id": "c5", "content": "z"}
    )
    assert status == 200
    cm = jp_serverapp.contents_manager
    store = jp_serverapp.web_app.settings["jupyter_agent_tools"].notebook_store
    for round_ in range(3):
        for name in ("plain.ipynb", "big.ipynb"):
            model = await cm.get(name, content=True, type="notebook")
            content = model["content"]
            content["cells"][-1]["source"] = f"# {name} {round_}"
            body = {"type": "notebook", "format": "json", "content": content}
            await store.contents_save(name, lambda name=name, body=body: cm.save(body, name))
    status, listing = await api("GET", "changes")
    assert [c["kind"] for c in listing["changes"]] == ["edit"]  # no save overwrote c5


@pytest.mark.parametrize(
    "jp_server_config",
    [
        {
            "ServerApp": {
                "jpserver_extensions": {"jupyter_agent_tools": True},
                "contents_manager_class": "jupyter_server.services.contents.filemanager.FileContentsManager",
            }
        }
    ],
)
async def test_a_synchronous_contents_manager_keeps_working_and_is_watched(jp_root_dir, api, jp_fetch):
    write(jp_root_dir)
    stale = await lab_copy(jp_fetch)
    status, _ = await api("POST", "notebooks", "nb.ipynb", body={"action": "delete", "cell_id": "two"})
    assert status == 200
    await lab_save(jp_fetch, stale)  # brings back the cell the agent deleted
    body = json.dumps({"type": "notebook"})  # a new notebook: the manager's new() calls save itself
    response = await jp_fetch("api", "contents", "new.ipynb", method="PUT", body=body)
    assert response.code == 201
    status, listing = await api("GET", "changes")
    newest, agents = listing["changes"][:2]
    assert newest["kind"] == "overwrite"
    assert newest["action"] == f"save over change {agents['id']}: cell two (inserted)"
