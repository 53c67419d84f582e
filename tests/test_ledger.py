"""The change ledger against a real server, real kernels and a real SQLite database (no mocks).

Every change the extension makes is recorded; it can be listed, shown with a diff and undone (the file's
bytes come back exactly), unless a cell it touched changed since (409 naming the cell, nothing written).
A read with ``since`` says what changed since an earlier answer and by whom. The ledger is never on the
data path: a locked database does not fail an edit.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

import nbformat
import pytest
from contract import Contract
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from jupyter_agent_tools.api_document import openapi_document

pytestmark = pytest.mark.timeout(180)
CONTRACT = Contract(openapi_document())
NB = "/api/agent/notebooks/{path}"
CHANGES = NB + "/changes"
CHANGE = CHANGES + "/{change_id}"
UNDO = CHANGE + "/undo"


@pytest.fixture
def jp_server_config(jp_root_dir: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "Ledger": {"db_path": str(jp_root_dir.parent / "ledger" / "ledger.db")},
    }


def sample() -> nbformat.NotebookNode:
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Title", id="md"),
            new_code_cell(
                "a = 1\nprint(a)",
                id="one",
                execution_count=1,
                outputs=[new_output("stream", name="stdout", text="1\n")],
            ),
            new_code_cell("b = 2", id="two"),
            new_code_cell("c = 3", id="three"),
        ]
    )
    nb.nbformat_minor = 5
    return nb


def write(root: Path, name: str = "nb.ipynb", nb: Any = None) -> Path:
    path = root / name
    nbformat.write(nb if nb is not None else sample(), str(path))
    return path


def app_of(jp_serverapp: Any) -> Any:
    return jp_serverapp.web_app.settings["jupyter_agent_tools"]


@pytest.fixture
def call(api):
    """An agent call whose answer is checked against the OpenAPI document."""

    async def _call(method: str, route: str, *parts: str, **kw: Any) -> tuple[int, Any]:
        status, answer = await api(method, *parts, **kw)
        CONTRACT.assert_response(method, route, status, answer)
        return status, answer

    return _call


EDIT = {
    "ops": [
        {"action": "edit", "cell_id": "one", "content": "a = 10\nprint(a)"},
        {"action": "insert", "cell_index": 2, "content": "new = True", "cell_id": "new"},
        {"action": "delete", "cell_id": "three"},
        {"action": "move", "cell_id": "md", "to_index": 3},
    ]
}


async def test_edit_list_diff_undo_restores_the_bytes(jp_root_dir, call):
    path = write(jp_root_dir)
    original = path.read_bytes()
    status, edited = await call("POST", NB, "notebooks", "nb.ipynb", body=EDIT)
    assert status == 200, edited
    assert edited["recorded"] is True and edited["change_id"]
    change_id = edited["change_id"]

    status, listing = await call("GET", CHANGES, "notebooks", "nb.ipynb", "changes")
    assert status == 200
    [entry] = listing["changes"]
    assert entry["id"] == change_id and entry["path"] == "nb.ipynb"
    assert entry["kind"] == "edit" and entry["via"] == "http" and entry["user"]
    assert entry["action"] == "edit 1 cell, insert 1, delete 1, move 1"
    assert entry["hash_after"] == edited["hash"] and entry["undoable"] is True
    whats = {c["id"]: c["what"] for c in entry["cells"]}
    assert whats == {"one": ["edited"], "new": ["inserted"], "three": ["deleted"], "md": ["moved"]}
    assert "before" not in entry["cells"][0]  # a listing has no bodies

    status, detail = await call("GET", CHANGE, "notebooks", "nb.ipynb", "changes", change_id)
    assert status == 200
    cells = {c["id"]: c for c in detail["cells"]}
    assert cells["one"]["before"] == {"source": "a = 1\nprint(a)"}
    assert cells["one"]["after"] == {"source": "a = 10\nprint(a)"}
    assert "-a = 1\n+a = 10\n" in cells["one"]["diff"]
    assert cells["three"]["after"] is None and cells["three"]["before"]["source"] == "c = 3"
    assert cells["new"]["before"] is None and "+new = True" in cells["new"]["diff"]

    status, undone = await call("POST", UNDO, "notebooks", "nb.ipynb", "changes", change_id, "undo")
    assert status == 200, undone
    assert path.read_bytes() == original
    assert undone["undoes"] == change_id and undone["recorded"] is True
    status, listing = await call("GET", CHANGES, "notebooks", "nb.ipynb", "changes")
    newest = listing["changes"][0]
    assert newest["id"] == undone["change_id"] and newest["undoes"] == change_id and newest["kind"] == "undo"

    # undoing the undo is a redo
    status, redone = await call("POST", UNDO, "notebooks", "nb.ipynb", "changes", undone["change_id"], "undo")
    assert status == 200, redone
    assert redone["hash"] == edited["hash"]


async def test_person_edit_through_contents_api_is_a_409_naming_the_cell(jp_root_dir, call, jp_fetch):
    path = write(jp_root_dir)
    status, edited = await call("POST", NB, "notebooks", "nb.ipynb", body=EDIT)
    assert status == 200
    # A person edits the cell the agent edited, through the contents API (what JupyterLab's save does).
    response = await jp_fetch("api", "contents", "nb.ipynb", params={"type": "notebook", "content": "1"})
    model = json.loads(response.body)
    nb = model["content"]
    for cell in nb["cells"]:
        cell["metadata"].pop("trusted", None)
        if cell["id"] == "one":
            cell["source"] = "a = 'person'"
    body = json.dumps({"type": "notebook", "format": "json", "content": nb})
    await jp_fetch("api", "contents", "nb.ipynb", method="PUT", body=body)
    before = path.read_bytes()

    status, error = await call(
        "POST", UNDO, "notebooks", "nb.ipynb", "changes", edited["change_id"], "undo", body={}
    )
    assert status == 409, error
    assert "cell one: its source changed since" in error["message"]
    assert error["conflicts"] == [{"id": "one", "what": "its source changed since"}]
    assert path.read_bytes() == before  # nothing written


async def test_read_since_names_a_persons_edits_and_the_agents(jp_root_dir, call, jp_fetch):
    write(jp_root_dir)
    status, first = await call("GET", NB, "notebooks", "nb.ipynb")
    assert status == 200
    status, edited = await call(
        "POST", NB, "notebooks", "nb.ipynb", body={"action": "edit", "cell_id": "two", "content": "b = 20"}
    )
    assert status == 200
    response = await jp_fetch("api", "contents", "nb.ipynb", params={"type": "notebook", "content": "1"})
    nb = json.loads(response.body)["content"]
    for cell in nb["cells"]:
        cell["metadata"].pop("trusted", None)
    nb["cells"][3]["source"] = "c = 'by a person'"
    del nb["cells"][0]
    body = json.dumps({"type": "notebook", "format": "json", "content": nb})
    await jp_fetch("api", "contents", "nb.ipynb", method="PUT", body=body)

    status, read = await call("GET", NB, "notebooks", "nb.ipynb", params={"since": first["hash"]})
    assert status == 200
    since = read["changes_since"]
    assert since["since"] == first["hash"] and since["since_known"] is True
    by_id = {c["id"]: c for c in since["cells"]}
    assert by_id["two"]["what"] == ["edited"] and by_id["two"]["via"] == "http"
    assert by_id["two"]["user"] and by_id["two"]["change_id"] == edited["change_id"]
    assert by_id["three"]["what"] == ["edited"] and by_id["three"]["user"] is None
    assert by_id["md"]["what"] == ["deleted"] and by_id["md"]["user"] is None
    assert set(by_id) == {"two", "three", "md"}

    # a hash the ledger never answered: said so, nothing guessed
    status, read = await call("GET", NB, "notebooks", "nb.ipynb", params={"since": "0" * 64})
    assert status == 200
    assert read["changes_since"] == {"since": "0" * 64, "since_known": False, "cells": []}
    status, read = await call("GET", NB, "notebooks", "nb.ipynb", params={"since": read["hash"]})
    assert read["changes_since"]["cells"] == [] and read["changes_since"]["since_known"] is True


async def test_bad_ids_times_and_hashes_are_4xx(jp_root_dir, call):
    write(jp_root_dir)
    write(jp_root_dir, "other.ipynb")
    status, edited = await call(
        "POST", NB, "notebooks", "other.ipynb", body={"action": "insert", "content": "x"}
    )
    assert status == 200
    other_id = edited["change_id"]
    for change_id, want in (("99999", 404), (other_id, 404), ("abc", 400), ("-1", 400), ("0", 400)):
        status, error = await call("GET", CHANGE, "notebooks", "nb.ipynb", "changes", change_id)
        assert status == want, (change_id, error)
        status, error = await call("POST", UNDO, "notebooks", "nb.ipynb", "changes", change_id, "undo")
        assert status == want, (change_id, error)
    status, error = await call("GET", CHANGES, "notebooks", "nb.ipynb", "changes", params={"before": "x"})
    assert status == 400
    status, error = await call("GET", CHANGES, "notebooks", "nb.ipynb", "changes", params={"limit": "0"})
    assert status == 400
    status, error = await call("GET", "/api/agent/changes", "changes", params={"since": "yesterday"})
    assert status == 400 and "ISO 8601" in error["message"]
    status, error = await call("GET", NB, "notebooks", "nb.ipynb", params={"since": "abc"})
    assert status == 400 and "64 hex digits" in error["message"]
    status, error = await call(
        "POST", UNDO, "notebooks", "other.ipynb", "changes", other_id, "undo", body={"nope": 1}
    )
    assert status == 400 and "nope" in error["message"]
    status, error = await call(
        "POST", UNDO, "notebooks", "other.ipynb", "changes", other_id, "undo", body={"expected_hash": "0"}
    )
    assert status == 409


async def test_changes_across_notebooks_newest_first(jp_root_dir, call):
    write(jp_root_dir)
    write(jp_root_dir, "other.ipynb")
    ids = []
    for name in ("nb.ipynb", "other.ipynb", "nb.ipynb"):
        status, edited = await call("POST", NB, "notebooks", name, body={"action": "insert", "content": "x"})
        ids.append(edited["change_id"])
    status, listing = await call("GET", "/api/agent/changes", "changes")
    assert status == 200
    assert [c["id"] for c in listing["changes"]] == ids[::-1]
    assert [c["path"] for c in listing["changes"]] == ["nb.ipynb", "other.ipynb", "nb.ipynb"]
    first_time = listing["changes"][-1]["time"]
    status, listing = await call("GET", "/api/agent/changes", "changes", params={"since": first_time})
    assert len(listing["changes"]) == 3
    status, listing = await call(
        "GET", "/api/agent/changes", "changes", params={"since": "2999-01-01T00:00Z"}
    )
    assert listing["changes"] == []
    status, page = await call("GET", CHANGES, "notebooks", "nb.ipynb", "changes", params={"limit": "1"})
    assert [c["id"] for c in page["changes"]] == [ids[2]] and page["next_before"] == ids[2]
    params = {"limit": "1", "before": page["next_before"]}
    status, page = await call("GET", CHANGES, "notebooks", "nb.ipynb", "changes", params=params)
    assert [c["id"] for c in page["changes"]] == [ids[0]]


async def test_undo_emits_the_change_event_with_undoes(jp_root_dir, api, agent_audit_events):
    write(jp_root_dir)
    status, edited = await api("POST", "notebooks", "nb.ipynb", body={"action": "delete", "cell_id": "two"})
    status, undone = await api("POST", "notebooks", "nb.ipynb", "changes", edited["change_id"], "undo")
    assert status == 200, undone
    events = agent_audit_events("notebook_change")
    assert [e.get("undoes") for e in events] == [None, edited["change_id"]]
    assert events[-1]["actions"] == ["undo"] and events[-1]["cell_ids"] == ["two"]


async def test_clear_outputs_is_recorded_and_undone(jp_root_dir, api):
    path = write(jp_root_dir)
    original = path.read_bytes()
    status, cleared = await api(
        "POST", "notebooks", "nb.ipynb", body={"action": "clear_outputs", "all": True}
    )
    assert status == 200
    status, listing = await api("GET", "notebooks", "nb.ipynb", "changes")
    entry = listing["changes"][0]
    assert entry["kind"] == "clear_outputs" and entry["cells"][0]["what"] == ["outputs"]
    status, _ = await api("POST", "notebooks", "nb.ipynb", "changes", cleared["change_id"], "undo")
    assert status == 200 and path.read_bytes() == original


@pytest.mark.parametrize(
    "jp_server_config",
    [
        {
            "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
            "Ledger": {"max_changes_per_notebook": 3},
        }
    ],
)
async def test_oldest_changes_are_pruned_first(jp_root_dir, api):
    write(jp_root_dir)
    ids = []
    for i in range(5):
        status, edited = await api(
            "POST", "notebooks", "nb.ipynb", body={"action": "edit", "cell_id": "two", "content": f"b = {i}"}
        )
        ids.append(edited["change_id"])
    status, listing = await api("GET", "notebooks", "nb.ipynb", "changes")
    assert [c["id"] for c in listing["changes"]] == ids[:1:-1]
    status, error = await api("GET", "notebooks", "nb.ipynb", "changes", ids[0])
    assert status == 404 and "No change" in error["message"]


async def test_a_locked_database_does_not_fail_an_edit(jp_root_dir, api, jp_serverapp):
    path = write(jp_root_dir)
    ledger = app_of(jp_serverapp).ledger
    status, first = await api("POST", "notebooks", "nb.ipynb", body={"action": "insert", "content": "1"})
    assert first["recorded"] is True
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    ledger.log.addHandler(handler)
    # the ledger may still be finishing the first change's transaction on its thread: wait for it
    holder = sqlite3.connect(ledger.db_path, timeout=10)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # another program holds the database locked, for real
        answers = []
        for content in ("2", "3"):
            status, answer = await api(
                "POST", "notebooks", "nb.ipynb", body={"action": "insert", "content": content}
            )
            assert status == 200, answer
            answers.append(answer)
        assert [a["recorded"] for a in answers] == [False, False]
        assert [a["change_id"] for a in answers] == [None, None]
        assert [c["source"] for c in nbformat.read(str(path), as_version=4).cells][-2:] == ["2", "3"]
    finally:
        holder.rollback()
        holder.close()
    warnings = [line for line in lines if line.startswith("The change ledger") and "cannot" in line]
    assert len(warnings) == 1, lines  # logged once
    status, answer = await api("POST", "notebooks", "nb.ipynb", body={"action": "insert", "content": "4"})
    assert answer["recorded"] is True
    ledger.log.removeHandler(handler)


async def test_via_is_cli_when_the_client_says_so(jp_root_dir, api):
    write(jp_root_dir)
    status, edited = await api(
        "POST",
        "notebooks",
        "nb.ipynb",
        body={"action": "insert", "content": "x"},
        headers={"X-Agent-Client": "cli"},
    )
    assert status == 200 and edited["recorded"] is True
    status, listing = await api("GET", "notebooks", "nb.ipynb", "changes")
    assert status == 200 and listing["changes"][0]["via"] == "cli"


async def test_undo_of_a_run_restores_the_earlier_outputs(jp_root_dir, api, jp_serverapp):
    nb = sample()
    nb.cells[2].outputs = [new_output("stream", name="stdout", text="stale\n")]
    nb.cells[2].execution_count = 7
    path = write(jp_root_dir, nb=nb)
    original = path.read_bytes()
    try:
        status, ran = await api("POST", "notebooks", "nb.ipynb", "run", body={"all": True, "timeout": 60})
        assert status == 200, ran
        assert [c["status"] for c in ran["cells"]] == ["skipped", "complete", "complete", "complete"]
        assert ran["recorded"] is True
        status, listing = await api("GET", "notebooks", "nb.ipynb", "changes")
        [entry] = listing["changes"]  # one entry for the whole run, not one per cell or write
        assert entry["id"] == ran["change_id"] and entry["kind"] == "run"
        assert entry["action"] == "run: outputs of 3 cells" and entry["hash_after"] == ran["hash"]
        assert {c["id"]: c["what"] for c in entry["cells"]} == {
            "one": ["outputs"],
            "two": ["outputs"],
            "three": ["outputs"],
        }
        assert path.read_bytes() != original
        status, undone = await api("POST", "notebooks", "nb.ipynb", "changes", ran["change_id"], "undo")
        assert status == 200, undone
        assert path.read_bytes() == original  # the outputs and execution counts the cells had before
    finally:
        for kernel_id in list(jp_serverapp.kernel_manager.list_kernel_ids()):
            await jp_serverapp.kernel_manager.shutdown_kernel(kernel_id)


async def test_undo_of_an_edit_after_a_run_restores_the_source_and_says_the_outputs_went(
    jp_root_dir, call, jp_fetch, jp_serverapp
):
    """The usual agent sequence, edit then run: undoing the edit is not refused for the run's outputs
    (they came from the source undone: cleared, and said); a source changed again since still is."""
    path = write(jp_root_dir)
    run = NB + "/run"
    try:
        edit = {"ops": [{"action": "edit", "cell_id": "two", "content": "b = 20\nprint(b)"}]}
        status, edited = await call("POST", NB, "notebooks", "nb.ipynb", body=edit)
        assert status == 200, edited
        status, ran = await call("POST", run, "notebooks", "nb.ipynb", "run", body={"cell_ids": ["two"]})
        assert status == 200 and ran["cells"][0]["status"] == "complete", ran
        assert nbformat.read(str(path), as_version=4).cells[2].outputs[0]["text"] == "20\n"

        status, undone = await call(
            "POST", UNDO, "notebooks", "nb.ipynb", "changes", edited["change_id"], "undo"
        )
        assert status == 200, undone
        assert undone["outputs_cleared"] == ["two"]
        assert "Cleared the outputs of cell two" in undone["message"]
        cell = nbformat.read(str(path), as_version=4).cells[2]
        assert (cell.source, cell.outputs, cell.execution_count) == ("b = 2", [], None)

        # A real conflict stays one: the person changes the source again after the agent's edit and run.
        status, edited = await call("POST", NB, "notebooks", "nb.ipynb", body=edit)
        status, ran = await call("POST", run, "notebooks", "nb.ipynb", "run", body={"cell_ids": ["two"]})
        assert status == 200, ran
        response = await jp_fetch("api", "contents", "nb.ipynb", params={"type": "notebook", "content": "1"})
        nb = json.loads(response.body)["content"]
        for c in nb["cells"]:
            c["metadata"].pop("trusted", None)
        nb["cells"][2]["source"] = "b = 'person'"
        body = json.dumps({"type": "notebook", "format": "json", "content": nb})
        await jp_fetch("api", "contents", "nb.ipynb", method="PUT", body=body)
        before = path.read_bytes()
        status, error = await call(
            "POST", UNDO, "notebooks", "nb.ipynb", "changes", edited["change_id"], "undo"
        )
        assert status == 409, error
        assert error["conflicts"] == [{"id": "two", "what": "its source and outputs changed since"}]
        assert "cell two: its source and outputs changed since" in error["message"]
        assert path.read_bytes() == before  # nothing written
    finally:
        for kernel_id in list(jp_serverapp.kernel_manager.list_kernel_ids()):
            await jp_serverapp.kernel_manager.shutdown_kernel(kernel_id)


@pytest.mark.parametrize(
    "jp_server_config",
    [
        {
            "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
            "Ledger": {"max_bytes": 256 * 1024},
        }
    ],
)
async def test_the_database_stays_within_its_byte_limit(jp_root_dir, api, jp_serverapp):
    write(jp_root_dir)
    ledger = app_of(jp_serverapp).ledger
    ids = []
    for i in range(150):
        content = f"# edit {i}\n" + os.urandom(2000).hex()  # 4 KB that do not compress, each time
        status, edited = await api(
            "POST", "notebooks", "nb.ipynb", body={"action": "edit", "cell_id": "two", "content": content}
        )
        assert status == 200 and edited["recorded"] is True, edited
        ids.append(edited["change_id"])
        await api("GET", "notebooks", "nb.ipynb")  # a read: its hash is remembered too
        assert ledger.db_bytes() <= 256 * 1024, (i, ledger.db_bytes())  # the file and its log
    status, listing = await api("GET", "notebooks", "nb.ipynb", "changes", params={"limit": "1000"})
    kept = [c["id"] for c in listing["changes"]]
    assert 10 < len(kept) < 150  # the oldest were pruned, first
    assert kept == ids[::-1][: len(kept)]
    status, detail = await api("GET", "notebooks", "nb.ipynb", "changes", kept[0])
    assert status == 200 and detail["cells"][0]["after"]["source"].startswith("# edit 149")


def test_changes_survive_a_server_restart(tmp_path: Path) -> None:
    from jupyter_agent_tools.testing.server import jupyter_server

    root = tmp_path / "root"
    root.mkdir()
    original = write(root).read_bytes()
    args = [f"--Ledger.db_path={tmp_path / 'ledger.db'}"]
    with jupyter_server(root, extra_args=args) as server, server.client() as client:
        edited = client.json("POST", "api/agent/notebooks/nb.ipynb", {"action": "delete", "cell_id": "two"})
        assert edited["recorded"] is True
    with jupyter_server(root, extra_args=args) as server, server.client() as client:
        listing = client.json("GET", "api/agent/notebooks/nb.ipynb/changes")
        assert [c["id"] for c in listing["changes"]] == [edited["change_id"]]
        read = client.json("GET", f"api/agent/notebooks/nb.ipynb?since={edited['hash']}")
        assert read["changes_since"]["since_known"] is True  # versions answered before are remembered
        client.json("POST", f"api/agent/notebooks/nb.ipynb/changes/{edited['change_id']}/undo")
    assert (root / "nb.ipynb").read_bytes() == original


@pytest.fixture
def corrupt_db(jp_root_dir: Path) -> Path:
    """The ledger file this module's servers use, corrupt (the ledger opens it at its first use)."""
    path = jp_root_dir.parent / "ledger" / "ledger.db"
    path.parent.mkdir()
    path.write_bytes(b"this is not an SQLite database" * 200)
    return path


async def test_a_corrupt_database_is_kept_aside_and_a_new_ledger_records_the_edit(
    corrupt_db, jp_root_dir, api, jp_serverapp
):
    path = write(jp_root_dir)
    assert app_of(jp_serverapp).ledger.db_path == str(corrupt_db)
    status, answer = await api("POST", "notebooks", "nb.ipynb", body={"action": "insert", "content": "1"})
    assert status == 200 and answer["recorded"] is True, answer
    assert nbformat.read(str(path), as_version=4).cells[-1].source == "1"
    aside = list(corrupt_db.parent.glob("ledger.db.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == b"this is not an SQLite database" * 200
    assert corrupt_db.read_bytes().startswith(b"SQLite format 3")
    status, listed = await api("GET", "notebooks", "nb.ipynb", "changes")
    assert status == 200 and [c["id"] for c in listed["changes"]] == [answer["change_id"]], listed


async def test_an_old_undo_is_refused_on_a_new_notebook_at_the_same_path(jp_root_dir, api, jp_fetch):
    cells = [{"cell_type": "code", "source": "a = 1"}, {"cell_type": "code", "source": "b = 2"}]
    status, created = await api("POST", "notebooks", "same.ipynb", body={"action": "create", "cells": cells})
    assert status == 201
    ids = [c["id"] for c in created["cells"]]  # derived from the path
    status, edited = await api(
        "POST", "notebooks", "same.ipynb", body={"action": "edit", "cell_id": ids[1], "content": "b = 3"}
    )
    assert status == 200 and edited["undoable"] is True
    await jp_fetch("api", "contents", "same.ipynb", method="DELETE")
    # a new notebook at the same path: the same derived ids, the cells as the old one's edit left them
    cells[1]["source"] = "b = 3"
    status, again = await api("POST", "notebooks", "same.ipynb", body={"action": "create", "cells": cells})
    assert status == 201 and [c["id"] for c in again["cells"]] == ids
    path = jp_root_dir / "same.ipynb"
    before = path.read_bytes()
    status, error = await api("POST", "notebooks", "same.ipynb", "changes", edited["change_id"], "undo")
    assert status == 409, error
    assert "was replaced since (it was created again" in error["message"]
    assert path.read_bytes() == before  # nothing written

    # the same through the contents API alone: deleted, and a new file saved there (JupyterLab)
    status, second = await api(
        "POST", "notebooks", "same.ipynb", body={"action": "edit", "cell_id": ids[0], "content": "a = 5"}
    )
    assert status == 200
    copy = path.read_text()
    await jp_fetch("api", "contents", "same.ipynb", method="DELETE")
    body = json.dumps({"type": "notebook", "format": "json", "content": json.loads(copy)})
    await jp_fetch("api", "contents", "same.ipynb", method="PUT", body=body)
    before = path.read_bytes()
    status, error = await api("POST", "notebooks", "same.ipynb", "changes", second["change_id"], "undo")
    assert status == 409 and "it was deleted or renamed" in error["message"], error
    assert path.read_bytes() == before


@pytest.mark.parametrize("how", ["removed", "overwritten"])
async def test_a_ledger_file_lost_under_the_running_server_is_said_and_started_again(
    how, jp_root_dir, api, jp_serverapp
):
    path = write(jp_root_dir)
    ledger = app_of(jp_serverapp).ledger
    db = Path(ledger.db_path)
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    ledger.log.addHandler(handler)
    try:
        status, first = await api("POST", "notebooks", "nb.ipynb", body={"action": "insert", "content": "1"})
        assert status == 200 and first["recorded"] is True
        await ledger._run(lambda: None)  # the ledger is idle (the version the edit answered is remembered)
        if how == "removed":  # an admin (or a cleanup job) removes the ledger's files
            for name in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
                name.unlink(missing_ok=True)
        else:  # something writes over the file in place (same inode)
            with open(db, "r+b") as f:
                f.write(b"garbage, not SQLite " * 500)
        status, lost = await api("POST", "notebooks", "nb.ipynb", body={"action": "insert", "content": "2"})
        assert status == 200 and lost["recorded"] is False and lost["change_id"] is None, lost
        assert nbformat.read(str(path), as_version=4).cells[-1].source == "2"  # the change itself is made
        assert any(how in line and "while the server ran" in line for line in lines), lines
        if how == "overwritten":
            assert len(list(db.parent.glob("ledger.db.corrupt-*"))) == 1  # moved aside, not reused
        status, later = await api("POST", "notebooks", "nb.ipynb", body={"action": "insert", "content": "3"})
        assert status == 200 and later["recorded"] is True, later
        status, listing = await api("GET", "notebooks", "nb.ipynb", "changes")
        assert [c["id"] for c in listing["changes"]] == [later["change_id"]]  # kept: in the new file
        assert db.read_bytes().startswith(b"SQLite format 3\x00")
    finally:
        ledger.log.removeHandler(handler)


FULL_MAX_BYTES = 16 * 1024 * 1024


class TestAtTheByteCap:
    @pytest.fixture
    def jp_server_config(self, full_db: Path) -> dict[str, Any]:
        return {
            "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
            "Ledger": {"db_path": str(full_db), "max_bytes": FULL_MAX_BYTES},
        }

    @pytest.fixture
    def full_db(self, jp_root_dir: Path) -> Path:
        """A ledger file at FULL_MAX_BYTES (past the room a write needs) with about 25,000 small old
        changes, as a ledger in use for months is: pruning 10% of it took ~20 s here, on the write's
        answer."""
        from jupyter_agent_tools.ledger.service import Ledger

        path = jp_root_dir.parent / "ledger" / "ledger.db"
        ledger = Ledger(db_path=str(path), max_bytes=FULL_MAX_BYTES)
        ledger._submit(ledger._db).result()  # the ledger's own schema and settings
        ledger.close()
        cells = json.dumps([{"id": "two", "what": ["edited"], "index_before": 2, "index_after": 2}])
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            while path.stat().st_size < FULL_MAX_BYTES - 1024 * 1024:  # the room a write needs: full
                rows = [
                    (1.0 + i, f"old{i % 100}.ipynb", "edit", "0" * 64, cells, os.urandom(300), 400)
                    for i in range(1000)
                ]
                conn.execute("BEGIN")
                conn.executemany(
                    "INSERT INTO changes (time, path, kind, action, hash_before, hash_after, cells, body, "
                    "bytes) VALUES (?1, ?2, ?3, 'edit 1 cell', ?4, ?4, ?5, ?6, ?7)",
                    rows,
                )
                conn.execute("COMMIT")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        return path

    async def test_an_edit_does_not_wait_for_pruning(self, jp_root_dir, api, jp_serverapp):
        import asyncio
        import time

        write(jp_root_dir)
        ledger = app_of(jp_serverapp).ledger
        answers = []
        for i in range(3):
            start = time.perf_counter()
            status, edited = await api(
                "POST",
                "notebooks",
                "nb.ipynb",
                body={"action": "edit", "cell_id": "two", "content": f"b = {i}"},
            )
            answers.append(time.perf_counter() - start)
            assert status == 200 and edited["recorded"] is True, edited
        assert max(answers) < 2.0, answers  # the prune (about 20 s here before) is not waited for
        deadline = time.monotonic() + 120
        while ledger._prune_target is not None:  # the background prune goes on, one step at a time
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        assert ledger.db_bytes() <= FULL_MAX_BYTES
        status, listing = await api("GET", "notebooks", "nb.ipynb", "changes")
        assert [c["action"] for c in listing["changes"]] == ["edit 1 cell"] * 3


def test_a_run_lost_to_a_killed_server_is_in_the_ledger_after_a_restart(tmp_path: Path) -> None:
    """A notebook run is one change, recorded when it ends; a server killed mid-run used to leave the
    outputs of its finished cells in the file and nothing in the ledger. Each write of the run is kept
    as it happens; the next start records them as the run's change (undoable as any run)."""
    import time

    from jupyter_agent_tools.testing.server import jupyter_server

    root = tmp_path / "root"
    root.mkdir()
    nb = new_notebook(
        cells=[
            new_code_cell("print('first')", id="first"),
            new_code_cell("print('second')", id="second"),
            new_code_cell("import time; time.sleep(120)", id="slow"),
        ]
    )
    nb.nbformat_minor = 5
    path = write(root, "long.ipynb", nb)
    original = path.read_bytes()
    args = [
        f"--Ledger.db_path={tmp_path / 'ledger.db'}",
        f"--RunRegistry.runs_db_path={tmp_path / 'runs.db'}",
    ]
    with jupyter_server(root, extra_args=args) as server, server.client() as client:
        run = client.json(
            "POST", "api/agent/notebooks/long.ipynb/run", {"all": True, "timeout": 600, "detach": True}, 202
        )
        deadline = time.monotonic() + 90
        while client.json("GET", f"api/agent/runs/{run['run_id']}")["cells_done"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(0.5)  # the second cell's outputs are saved (and its write kept) after its end event
        server.process.kill()  # a crash: nothing runs at shutdown
        server.process.wait(10)
    saved = nbformat.read(str(path), as_version=4)
    assert [c.outputs[0]["text"] for c in saved.cells[:2]] == ["first\n", "second\n"]
    with jupyter_server(root, extra_args=args) as server, server.client() as client:
        listing = client.json("GET", "api/agent/notebooks/long.ipynb/changes")
        [entry] = listing["changes"]
        assert entry["kind"] == "run" and entry["undoable"] is True, entry
        assert entry["action"] == "run: outputs of 2 cells (the server stopped during it)"
        assert {c["id"]: c["what"] for c in entry["cells"]} == {"first": ["outputs"], "second": ["outputs"]}
        client.json("POST", f"api/agent/notebooks/long.ipynb/changes/{entry['id']}/undo")
    assert path.read_bytes() == original
