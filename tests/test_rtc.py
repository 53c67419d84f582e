"""Live edits of notebooks open in a real jupyter-collaboration room (no mocks).

The server runs jupyter_server_ydoc (and the file id service it needs) next to our extension; a simulated
JupyterLab client (``rtc_client.RoomClient``) holds the notebook open over the real websocket and sync
protocol. The agent's edits must reach that client without a reload, keep what the person typed, reach the
file through the room's autosave, and answer exactly as an edit of the file would.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

pytest.importorskip("jupyter_server_ydoc", reason="jupyter-collaboration is not installed")

from rtc_client import collaboration_config, until

SAVE_DELAY = 0.2


@pytest.fixture
def save_delay() -> float | None:
    return SAVE_DELAY


@pytest.fixture
def rtc_mode() -> str:
    return "auto"


@pytest.fixture
def jp_server_config(jp_root_dir: Path, save_delay: float | None, rtc_mode: str) -> dict[str, Any]:
    return {**collaboration_config(jp_root_dir, save_delay), "LiveDocuments": {"mode": rtc_mode}}


def sample(minor: int = 5) -> nbformat.NotebookNode:
    """A notebook as JupyterLab saves one (kernelspec and language_info set, so the room adds nothing)."""
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Live notebook\n\nText."),
            new_code_cell(
                "a = 1\nb = 2\nprint(a + b)",
                execution_count=1,
                outputs=[new_output("stream", name="stdout", text="3\n")],
            ),
            new_code_cell(
                "x = 'ünïcödé ✓'\nx",
                execution_count=2,
                outputs=[
                    new_output(
                        "display_data",
                        data={"image/png": "iVBORw0KGgo=\n", "text/html": "<b>one</b>\n<i>two</i>"},
                        metadata={"image/png": {"width": 10}},
                    ),
                    new_output(
                        "execute_result",
                        execution_count=2,
                        data={"text/plain": "'ünïcödé ✓'\nsecond line", "application/json": {"a": [1, 2.5]}},
                    ),
                ],
            ),
            new_code_cell("last = True"),
        ],
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        },
    )
    nb.nbformat_minor = minor
    for i, cell in enumerate(nb.cells):
        if minor >= 5:
            cell.id = f"cell-{i}"
        else:
            cell.pop("id", None)
    return nb


def write(root: Path, name: str, nb: nbformat.NotebookNode) -> Path:
    path = root / name
    path.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_client_sees_agent_insert_without_reload(jp_root_dir, api, connect):
    path = write(jp_root_dir, "live.ipynb", sample())
    file_hash = sha(path)
    client = await connect("live.ipynb")
    events: list[Any] = []
    client.notebook.ycells.observe(lambda event: events.append(event.delta))

    status, read = await api("GET", "notebooks", "live.ipynb")
    assert status == 200
    assert read["hash"] == file_hash  # nothing typed yet: the live document serializes to the file's bytes

    status, answer = await api(
        "POST",
        "notebooks",
        "live.ipynb",
        body={"action": "insert", "cell_index": 1, "content": "print('agent')"},
    )
    assert status == 200, answer
    assert answer["message"] == "Inserted code cell at index 1. Notebook now has 5 cells."
    await until(lambda: "print('agent')" in client.sources(), "the client to see the inserted cell")
    assert client.sources()[1] == "print('agent')"
    assert client.cell_ids()[1] == answer["details"]["cellId"]
    # One array change, an insert after the first cell: the other cells were not rewritten.
    assert len(events) == 1
    assert events[0][0] == {"retain": 1}
    assert len(events[0][1]["insert"]) == 1 and len(events[0]) == 2

    status, again = await api("GET", "notebooks", "live.ipynb")
    assert again["hash"] == answer["hash"]


async def test_live_answer_equals_file_answer(jp_root_dir, api, connect):
    """Same batch on the same notebook, once live and once as a file: same answer, same bytes in the end."""
    for minor in (5, 4):
        live_name, file_name = f"live{minor}.ipynb", f"file{minor}.ipynb"
        live_path = write(jp_root_dir, live_name, sample(minor))
        file_path = write(jp_root_dir, file_name, sample(minor))
        client = await connect(live_name)
        batch = {
            "ops": [
                {"action": "move", "cell_index": 0, "to_index": 3},
                {"action": "edit", "cell_index": 0, "content": "a = 1\nb = 3\nprint(a + b)"},
                {"action": "edit", "cell_index": 1, "content": "converted", "cell_type": "markdown"},
                {"action": "insert", "cell_index": 2, "content": "## new", "cell_type": "markdown"},
                {"action": "delete", "cell_index": 3},
                {"action": "insert", "content": "appended = 1"},
            ]
        }
        if minor >= 5:
            batch["ops"].append({"action": "insert", "cell_index": 0, "content": "first", "cell_id": "mine"})
        status, live = await api("POST", "notebooks", live_name, body=batch)
        assert status == 200, live
        status, expected = await api("POST", "notebooks", file_name, body=batch)
        assert status == 200, expected
        assert live.pop("change_id") != expected.pop("change_id")  # two changes: two ledger entries
        assert live == expected
        assert expected["hash"] == sha(file_path)
        # The room saves the live document; the file then has exactly the bytes the file edit wrote.
        await until(
            lambda p=live_path, h=expected["hash"]: sha(p) == h, f"nbformat 4.{minor} file to converge"
        )
        assert live_path.read_bytes() == file_path.read_bytes()
        final = nbformat.reads(file_path.read_text(), as_version=4)
        assert client.sources() == [cell.source for cell in final.cells]
        # The moved and edited code cell kept its outputs in the live document too.
        moved = next(c for c in client.notebook.ycells if str(c["source"]).startswith("a = 1"))
        assert moved["outputs"].to_py()[0]["text"] == "3\n"


async def test_hash_is_that_of_the_file_the_room_writes(jp_root_dir, api, connect):
    """A notebook the room normalizes on load (it adds kernelspec and language_info to empty metadata):
    the live hash describes the normalized document, and the room then writes exactly those bytes."""
    nb = sample()
    nb.metadata = {}
    path = write(jp_root_dir, "bare.ipynb", nb)
    await connect("bare.ipynb")
    status, read = await api("GET", "notebooks", "bare.ipynb")
    assert read["hash"] != sha(path)
    status, answer = await api(
        "POST",
        "notebooks",
        "bare.ipynb",
        body={"action": "delete", "cell_index": 0, "expected_hash": read["hash"]},
    )
    assert status == 200, answer
    await until(lambda: sha(path) == answer["hash"], "the room to write the hashed document")
    assert set(nbformat.reads(path.read_text(), as_version=4).metadata) == {"kernelspec", "language_info"}


async def test_edit_changes_only_the_edited_text(jp_root_dir, api, connect):
    write(jp_root_dir, "text.ipynb", sample())
    client = await connect("text.ipynb")
    changes: list[Any] = []
    client.notebook.ycells.observe_deep(lambda events: changes.extend((e.path, e.delta) for e in events))
    status, answer = await api(
        "POST",
        "notebooks",
        "text.ipynb",
        body={"action": "edit", "cell_id": "cell-2", "content": "x = 'ünïcödé ✗'\nx"},
    )
    assert status == 200, answer
    await until(lambda: client.sources()[2] == "x = 'ünïcödé ✗'\nx", "the edit to arrive")
    # A single text change in cell 2's source, replacing one character: no cell was replaced.
    # (pycrdt counts text positions in UTF-8 bytes.)
    kept = len("x = 'ünïcödé ".encode())
    assert changes == [([2, "source"], [{"retain": kept}, {"delete": len("✓".encode())}, {"insert": "✗"}])]


async def test_person_edit_just_before_agent_edit_is_kept(jp_root_dir, api, connect):
    path = write(jp_root_dir, "both.ipynb", sample())
    client = await connect("both.ipynb")
    # The person types at the end of the first cell; the agent edits another cell and inserts one, at once.
    client.type_at_end(0, "\nTyped by a person.")
    status, answer = await api(
        "POST",
        "notebooks",
        "both.ipynb",
        body={
            "ops": [
                {"action": "edit", "cell_id": "cell-3", "content": "last = False"},
                {"action": "insert", "cell_index": 1, "content": "agent = 1"},
            ]
        },
    )
    assert status == 200, answer

    def merged(sources: list[str]) -> bool:
        return (
            sources[0].endswith("Typed by a person.") and "agent = 1" in sources and "last = False" in sources
        )

    await until(lambda: merged(client.sources()), "the client to hold both edits")
    status, read = await api("GET", "notebooks", "both.ipynb")
    assert merged([cell["source"] for cell in read["cells"]])

    def saved() -> bool:
        try:  # the contents manager writes in place: the file may be caught half written
            nb = nbformat.reads(path.read_text(), as_version=4)
        except Exception:
            return False
        return merged([cell.source for cell in nb.cells])

    await until(saved, "the file to hold both edits")


@pytest.mark.parametrize("save_delay", [None])  # the room never saves: what GET shows is unsaved
async def test_get_reads_unsaved_edits_and_stale_hash_is_409(jp_root_dir, api, connect):
    path = write(jp_root_dir, "stale.ipynb", sample())
    on_disk = path.read_bytes()
    client = await connect("stale.ipynb")
    status, before = await api("GET", "notebooks", "stale.ipynb")
    assert status == 200

    client.type_at_end(1, "\n# a person's unsaved line")

    async def person_visible() -> Any:
        _, read = await api("GET", "notebooks", "stale.ipynb")
        return read if read["cells"][1]["source"].endswith("# a person's unsaved line") else None

    now = await until(person_visible, "GET to show the person's unsaved edit")
    assert now["hash"] != before["hash"]
    # a page or named cells of the live document, with its hash and cell count
    status, page = await api("GET", "notebooks", "stale.ipynb", params={"cell_ids": "@1"})
    assert status == 200 and page["cells"][0]["source"] == now["cells"][1]["source"]
    assert (page["hash"], page["cell_count"]) == (now["hash"], len(now["cells"]))
    assert path.read_bytes() == on_disk  # unsaved indeed

    status, error = await api(
        "POST",
        "notebooks",
        "stale.ipynb",
        body={"action": "edit", "cell_index": 1, "content": "overwritten", "expected_hash": before["hash"]},
    )
    assert status == 409, error
    assert before["hash"] in error["message"] and now["hash"] in error["message"]
    assert client.sources()[1].endswith("# a person's unsaved line")

    status, answer = await api(
        "POST",
        "notebooks",
        "stale.ipynb",
        body={"action": "edit", "cell_index": 3, "content": "agent", "expected_hash": now["hash"]},
    )
    assert status == 200, answer
    await until(lambda: client.sources()[3] == "agent", "the guarded edit to arrive")
    assert client.sources()[1].endswith("# a person's unsaved line")


async def test_errors_are_those_of_the_file_path(jp_root_dir, api, connect):
    path = write(jp_root_dir, "errors.ipynb", sample())
    client = await connect("errors.ipynb")
    bad = {"ops": [{"action": "insert", "content": "ok"}, {"action": "delete", "cell_index": 99}]}
    status, error = await api("POST", "notebooks", "errors.ipynb", body=bad)
    assert status == 400
    assert error["message"].startswith("ops[1]: Cell index 99 is out of range for delete")
    status, error = await api(
        "POST", "notebooks", "errors.ipynb", body={"action": "edit", "cell_id": "nope", "content": ""}
    )
    assert (status, error["message"]) == (400, "Cell id 'nope' not found in notebook")
    assert len(client.sources()) == 4
    status, read = await api("GET", "notebooks", "errors.ipynb")
    assert read["hash"] == sha(path)  # nothing was applied to the live document


@pytest.mark.parametrize("rtc_mode", ["NEVER"])  # caseless
async def test_rtc_mode_never_writes_the_file(jp_root_dir, api, connect, jp_serverapp):
    path = write(jp_root_dir, "never.ipynb", sample())
    client = await connect("never.ipynb")
    app = jp_serverapp.extension_manager.extension_apps["jupyter_agent_tools"]
    assert {a.notebook_store.live.mode for a in app} == {"never"}
    status, answer = await api(
        "POST", "notebooks", "never.ipynb", body={"action": "insert", "content": "to disk"}
    )
    assert status == 200, answer
    # Written through the contents manager before the answer, as without collaboration.
    assert sha(path) == answer["hash"]
    assert nbformat.reads(path.read_text(), as_version=4).cells[-1].source == "to disk"
    # The room notices the file changed and reloads it.
    await until(lambda: client.sources()[-1] == "to disk", "the room to reload the file")


async def test_notebook_without_room_is_edited_on_disk(jp_root_dir, api):
    path = write(jp_root_dir, "closed.ipynb", sample())
    status, answer = await api(
        "POST", "notebooks", "closed.ipynb", body={"action": "insert", "content": "disk"}
    )
    assert status == 200
    assert sha(path) == answer["hash"]


def test_nothing_from_rtc_is_imported_without_a_room():
    code = (
        "import sys, jupyter_agent_tools.app, jupyter_agent_tools.notebook.store\n"
        "bad = [m for m in ('pycrdt', 'jupyter_ydoc', 'jupyter_server_ydoc', 'jupyter_server_documents') "
        "if m in sys.modules]\n"
        "print(json.dumps(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == []


async def test_live_notebook_repair_of_notebook_fields_is_refused(jp_root_dir, api, connect):
    nb = sample()
    nb.metadata["kernelspec"] = "python3"  # invalid: nbformat wants an object
    write(jp_root_dir, "invalid.ipynb", nb)
    await connect("invalid.ipynb")
    status, read = await api("GET", "notebooks", "invalid.ipynb")
    assert status == 200, read
    assert read["problems"] == ["notebook 'metadata'/'kernelspec': 'python3' is not of type 'object'"]
    edit = {"action": "edit", "cell_index": 3, "content": "last = False"}
    status, answer = await api("POST", "notebooks", "invalid.ipynb", body=edit)
    assert status == 400 and answer["message"].startswith("Notebook invalid.ipynb was already invalid")
    status, answer = await api("POST", "notebooks", "invalid.ipynb", body={**edit, "repair": True})
    assert status == 400, answer
    assert answer["message"].startswith("Notebook invalid.ipynb is open in a collaborative room")


async def test_undo_goes_through_the_live_document(jp_root_dir, api, connect):
    write(jp_root_dir, "undo.ipynb", sample())
    client = await connect("undo.ipynb")
    original = client.sources()
    status, edited = await api(
        "POST",
        "notebooks",
        "undo.ipynb",
        body={
            "ops": [
                {"action": "edit", "cell_id": "cell-1", "content": "a = 10"},
                {"action": "delete", "cell_id": "cell-3"},
            ]
        },
    )
    assert status == 200 and edited["recorded"] is True, edited
    await until(lambda: len(client.sources()) == 3, "the client to see the edit")
    status, undone = await api("POST", "notebooks", "undo.ipynb", "changes", edited["change_id"], "undo")
    assert status == 200, undone
    await until(lambda: client.sources() == original, "the client to see the undo")
    assert client.cell_ids() == ["cell-0", "cell-1", "cell-2", "cell-3"]


async def test_undo_after_a_persons_live_edit_is_409_and_writes_nothing(jp_root_dir, api, connect):
    write(jp_root_dir, "person.ipynb", sample())
    client = await connect("person.ipynb")
    status, first = await api("GET", "notebooks", "person.ipynb")
    status, edited = await api(
        "POST", "notebooks", "person.ipynb", body={"action": "edit", "cell_id": "cell-1", "content": "a = 10"}
    )
    assert status == 200, edited
    await until(lambda: client.sources()[1] == "a = 10", "the client to see the edit")
    client.type_at_end(1, "  # typed by a person")

    async def person_visible() -> Any:
        _, read = await api("GET", "notebooks", "person.ipynb")
        return read if read["cells"][1]["source"].endswith("# typed by a person") else None

    now = await until(person_visible, "the person's edit to reach the room")
    status, error = await api("POST", "notebooks", "person.ipynb", "changes", edited["change_id"], "undo")
    assert status == 409, error
    assert error["conflicts"] == [{"id": "cell-1", "what": "its source changed since"}]
    assert "cell cell-1: its source changed since" in error["message"]
    status, read = await api("GET", "notebooks", "person.ipynb")
    assert read["hash"] == now["hash"]  # nothing written
    assert client.sources()[1] == "a = 10  # typed by a person"
    # what changed since the first read: the agent's edit, then the person's on top of it
    status, read = await api("GET", "notebooks", "person.ipynb", params={"since": first["hash"]})
    [cell] = read["changes_since"]["cells"]
    assert (cell["id"], cell["what"], cell["user"]) == ("cell-1", ["edited"], None)


async def test_replace_reaches_the_room_and_keeps_what_the_person_typed(jp_root_dir, api, connect):
    """A replace inside a cell of a notebook open in a room is applied to the live document: the person's
    client sees it without a reload, text they typed in another cell stays, and the room saves both."""
    path = write(jp_root_dir, "replace.ipynb", sample())
    client = await connect("replace.ipynb")
    client.type_at_end(3, "\n# typed by a person")

    async def server_has_typed() -> bool:
        _, read = await api("GET", "notebooks", "replace.ipynb")
        return "typed by a person" in read["cells"][3]["source"]

    await until(server_has_typed, "the typed text to reach the server's document")
    status, refused = await api(
        "POST",
        "notebooks",
        "replace.ipynb",
        body={"action": "replace", "cell_index": 1, "old": "a", "new": "q"},
    )
    assert status == 400 and "matches 2 times" in refused["message"] and len(refused["matches"]) == 2
    status, answer = await api(
        "POST",
        "notebooks",
        "replace.ipynb",
        body={"action": "replace", "cell_id": "cell-1", "old": "b = 2", "new": "b = 40"},
    )
    assert status == 200, answer
    assert answer["details"]["replacements"] == 1 and answer["change_id"]
    await until(lambda: "b = 40" in client.sources()[1], "the client to see the replacement")
    assert client.sources()[1] == "a = 1\nb = 40\nprint(a + b)"
    await until(
        lambda: "b = 40" in path.read_text() and "typed by a person" in path.read_text(),
        "the room to save the replacement and the typed text",
    )
    saved = nbformat.reads(path.read_text(), as_version=4)
    assert saved.cells[1].outputs[0]["text"] == "3\n"  # outputs kept


async def test_an_answered_live_edit_is_in_the_rooms_store_though_the_room_stopped(
    jp_root_dir, api, connect, jp_serverapp
):
    """An agent's live edit is in the room's Y store when it is answered, though the room stopped first.

    A server's stop cancels the room's own store writes while its pending autosave still writes the file:
    the restarted room then finds its store behind the file, reloads the file as new Y items, and a page
    that stayed open merges its copy of the cell back in (the cell twice, with one id). Here the store is
    busy (its lock held) when the edit is applied, as on a loaded machine, and the room stops meanwhile.
    """
    import sqlite3

    from jupyter_ydoc import YNotebook
    from pycrdt import Doc

    write(jp_root_dir, "live.ipynb", sample())
    client = await connect("live.ipynb")
    settings = jp_serverapp.web_app.settings
    file_id = settings["file_id_manager"].get_id("live.ipynb")
    room = settings["jupyter_server_ydoc"].ywebsocket_server.rooms[f"json:notebook:{file_id}"]
    body = {"action": "insert", "content": "before = 'restart'", "cell_id": "before"}
    await room.ystore.lock.acquire()
    try:
        edit = asyncio.ensure_future(api("POST", "notebooks", "live.ipynb", body=body))
        await until(lambda: "before = 'restart'" in client.sources(), "the edit to reach the room")
        await room.stop()  # as the server's stop does: the room's pending store write is cancelled
    finally:
        room.ystore.lock.release()
    status, answer = await edit
    assert status == 200, answer

    db = sqlite3.connect(str(jp_root_dir.parent / "rtc-state" / "ystore.db"))
    try:
        updates = db.execute("SELECT path, yupdate FROM yupdates ORDER BY rowid").fetchall()
    finally:
        db.close()
    stored = Doc()
    for path, update in updates:
        if file_id in path:
            stored.apply_update(update)
    sources = [cell["source"] for cell in YNotebook(stored).get()["cells"]]
    assert sources[-1] == "before = 'restart'", sources


async def test_an_answered_live_edit_is_in_the_file_though_the_room_stopped_right_after(
    jp_root_dir, api, connect, jp_serverapp
):
    """An agent's live edit is in the notebook's file when it is answered: a server stop right after
    cancels the room's autosave, still waiting for its delay, and the restarted room takes the file over
    its store (the answered edit would be gone: the panel's restart test lost it so)."""
    path = write(jp_root_dir, "saved.ipynb", sample())
    client = await connect("saved.ipynb")
    settings = jp_serverapp.web_app.settings
    file_id = settings["file_id_manager"].get_id("saved.ipynb")
    room = settings["jupyter_server_ydoc"].ywebsocket_server.rooms[f"json:notebook:{file_id}"]
    room._save_delay = 30.0  # the autosave waits past the stop (any delay can)
    body = {"action": "insert", "content": "kept = 'after the stop'", "cell_id": "kept"}
    status, answer = await api("POST", "notebooks", "saved.ipynb", body=body)
    assert status == 200, answer
    await room.stop()  # as the server's stop does: the pending autosave is cancelled
    saved = nbformat.reads(path.read_text(), as_version=4)
    assert saved.cells[-1].source == "kept = 'after the stop'"
    assert sha(path) == answer["hash"]  # the answered hash is the file's
    assert "kept = 'after the stop'" in client.sources()


async def test_a_live_edit_leaves_the_file_alone_when_autosave_is_off(
    jp_root_dir, api, connect, jp_serverapp
):
    """With the room's autosave off, an agent's live edit reaches the people in the room and not the file
    (as their own typing does): the file waits for a save someone asks for."""
    path = write(jp_root_dir, "manual.ipynb", sample())
    before = path.read_bytes()
    client = await connect("manual.ipynb")
    settings = jp_serverapp.web_app.settings
    file_id = settings["file_id_manager"].get_id("manual.ipynb")
    room = settings["jupyter_server_ydoc"].ywebsocket_server.rooms[f"json:notebook:{file_id}"]
    room._save_delay = None  # document_save_delay = None
    body = {"action": "insert", "content": "unsaved = True", "cell_id": "unsaved"}
    status, answer = await api("POST", "notebooks", "manual.ipynb", body=body)
    assert status == 200, answer
    await until(lambda: "unsaved = True" in client.sources(), "the client to see the edit")
    assert path.read_bytes() == before
