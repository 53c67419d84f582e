"""The run route on a notebook open in a real jupyter-collaboration room (no mocks).

A simulated JupyterLab client (``rtc_client.RoomClient``) holds the notebook open over the real websocket
and sync protocol while ``POST /api/agent/notebooks/{path}/run`` runs a cell that prints, blocks on a
file the test creates, and prints again: the client must see the first output while the cell is still
running, end with the outputs a run of the file stores, and keep what the person typed meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from samples import KERNELSPEC
from test_notebook_run import EVERY_KIND

pytest.importorskip("jupyter_server_ydoc", reason="jupyter-collaboration is not installed")

from rtc_client import RoomClient, collaboration_config, until


@pytest.fixture
def jp_server_config(jp_root_dir: Path) -> dict[str, Any]:
    return {
        **collaboration_config(jp_root_dir),
        "LiveDocuments": {"mode": "auto"},
        "CellExecutor": {"interrupt_grace": 2.0},
    }


def blocking_cell(flag: Path) -> str:
    """Prints, waits until ``flag`` exists (the test decides when), prints again."""
    return (
        "import os, time\n"
        "print('first line', flush=True)\n"
        f"while not os.path.exists({str(flag)!r}):\n"
        "    time.sleep(0.02)\n"
        "print('second line')"
    )


def make(root: Path, name: str, flag: Path) -> Path:
    cells = [
        new_code_cell(blocking_cell(flag)),
        new_markdown_cell("# Notes"),
        new_code_cell("z = 3"),
    ]
    for i, cell in enumerate(cells):
        cell["id"] = f"c{i}"
    nb = new_notebook(
        cells=cells,
        metadata={"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}},
    )
    path = root / name
    path.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
    return path


FIRST = [{"output_type": "stream", "name": "stdout", "text": "first line\n"}]
BOTH = [{"output_type": "stream", "name": "stdout", "text": "first line\nsecond line\n"}]


def live_outputs(client: RoomClient, index: int) -> list[dict[str, Any]]:
    """A cell's outputs as the client's shared document has them, in file form (stream text joined)."""
    outputs = client.notebook.ycells[index]["outputs"].to_py()
    plain = json.loads(json.dumps(outputs))
    for output in plain:
        if isinstance(output.get("text"), list):
            output["text"] = "".join(output["text"])
    return list(plain)


def live_count(client: RoomClient, index: int) -> Any:
    return client.notebook.ycells[index].to_py().get("execution_count")


def read_file(path: Path) -> nbformat.NotebookNode | None:
    try:  # the room's contents manager writes in place: the file may be caught half written
        return nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
    except Exception:
        return None


async def run(api: Any, name: str, **body: Any) -> dict[str, Any]:
    status, answer = await api("POST", "notebooks", name, "run", body=body)
    assert status == 200, answer
    return dict(answer)


async def test_outputs_stream_into_the_room_and_end_as_a_file_run_stores_them(api, jp_root_dir, connect):
    live_flag, file_flag = jp_root_dir.parent / "live.flag", jp_root_dir.parent / "file.flag"
    path = make(jp_root_dir, "live.ipynb", live_flag)
    file_path = make(jp_root_dir, "file.ipynb", file_flag)
    client = await connect("live.ipynb")
    cell_list_changes: list[Any] = []
    client.notebook.ycells.observe(lambda event: cell_list_changes.append(event.delta))

    running = asyncio.create_task(run(api, "live.ipynb", cell_ids=["c0"]))
    try:
        # The cell is blocked on the flag, which does not exist yet: the first line must be there now.
        await until(
            lambda: "first line\n" in [o.get("text") for o in live_outputs(client, 0)],
            "the first line to reach the client while the cell runs",
        )
        assert not running.done()
        assert live_outputs(client, 0) == FIRST
        deep: list[Any] = []
        client.notebook.ycells.observe_deep(lambda events: deep.extend((e.path, e.delta) for e in events))
    finally:
        live_flag.touch()
    answer = await asyncio.wait_for(running, 30)
    (cell,) = answer["cells"]
    assert cell["status"] == "complete" and cell["outputs_written"]
    assert cell["output"] == "first line\nsecond line\n"

    # The same cell run from the file (no room): what it stores is what the live document ends with.
    file_flag.touch()
    file_answer = await run(api, "file.ipynb", cell_ids=["c0"])
    expected = nbformat.read(str(file_path), as_version=4).cells[0]
    assert expected.outputs == BOTH
    await until(lambda: live_outputs(client, 0) == expected.outputs, "the final outputs to reach the client")
    assert live_count(client, 0) == cell["execution_count"] == expected.execution_count
    assert isinstance(expected.execution_count, int) and file_answer["cells"][0]["execution_count"] == 1
    # Outputs change inside the running cell: it is never deleted and re-created (which would reset
    # its editor in JupyterLab and drop what a person types into it while the update travels).
    assert cell_list_changes == []
    # The second line streamed into the text of the first line's output, as in JupyterLab; nothing
    # else changed (the execution count was set with the first output).
    appended = [{"retain": len("first line\n")}, {"insert": "second line\n"}]
    assert deep == [([0, "outputs", 0, "text"], appended)]

    # The agent API reads the live document exactly so, and its hash is that of the file the room saves.
    status, read = await api("GET", "notebooks", "live.ipynb")
    assert status == 200
    assert read["cells"][0]["outputs"] == expected.outputs and read["hash"] == answer["hash"]

    def saved() -> bool:
        nb = read_file(path)
        return nb is not None and nb.cells[0].outputs == expected.outputs

    await until(saved, "the room to save the outputs")
    saved_nb = read_file(path)
    assert saved_nb is not None and saved_nb.cells[0].execution_count == expected.execution_count


async def test_a_person_editing_during_the_run_keeps_the_edits(api, jp_root_dir, connect):
    flag = jp_root_dir.parent / "edit.flag"
    path = make(jp_root_dir, "edit.ipynb", flag)
    client = await connect("edit.ipynb")
    cell_list_changes: list[Any] = []
    client.notebook.ycells.observe(lambda event: cell_list_changes.append(event.delta))
    running = asyncio.create_task(run(api, "edit.ipynb", cell_ids=["c0"]))
    try:
        await until(
            lambda: live_outputs(client, 0) != [], "the first output to reach the client while the cell runs"
        )
        assert not running.done()
        # While the cell runs, the person edits another cell and types into the running cell.
        client.type_at_end(2, "\nz += 1  # typed by a person")
        client.type_at_end(0, "\n# a person's note in the running cell")

        async def server_has_edits() -> bool:
            _, read = await api("GET", "notebooks", "edit.ipynb")
            sources = [c["source"] for c in read["cells"]]
            return sources[2].endswith("# typed by a person") and sources[0].endswith("running cell")

        await until(server_has_edits, "the person's edits to reach the room")
        assert not running.done()
    finally:
        flag.touch()
    answer = await asyncio.wait_for(running, 30)
    (cell,) = answer["cells"]
    assert cell["status"] == "complete" and cell["outputs_written"]
    # The kernel ran the source as it was when the run started.
    assert cell["output"] == "first line\nsecond line\n"

    final = BOTH

    def merged(sources: list[str]) -> bool:
        return (
            sources[0] == blocking_cell(flag) + "\n# a person's note in the running cell"
            and sources[2] == "z = 3\nz += 1  # typed by a person"
        )

    await until(
        lambda: merged(client.sources()) and live_outputs(client, 0) == final,
        "the client to hold the person's edits and the run's outputs",
    )
    assert live_count(client, 0) == cell["execution_count"]
    assert cell_list_changes == []  # no cell was replaced: typing in flight merges as text
    status, read = await api("GET", "notebooks", "edit.ipynb")
    assert status == 200
    assert merged([c["source"] for c in read["cells"]]) and read["cells"][0]["outputs"] == final

    def saved() -> bool:
        nb = read_file(path)
        return nb is not None and merged([c.source for c in nb.cells]) and nb.cells[0].outputs == final

    await until(saved, "the room to save both the edits and the outputs")


async def test_every_kind_of_output_live_equals_the_file_run(api, jp_root_dir, connect):
    """Clearing, display updates, images, errors: the live document ends exactly as the file run stores
    it (same answer, same bytes once the room saves), and no cell is re-created along the way."""
    for name in ("kinds-live.ipynb", "kinds-file.ipynb"):
        cells = [new_code_cell(source) for source in EVERY_KIND]
        for i, cell in enumerate(cells):
            cell["id"] = f"c{i}"
        metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
        nb = new_notebook(cells=cells, metadata=metadata)
        (jp_root_dir / name).write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
    client = await connect("kinds-live.ipynb")
    cell_list_changes: list[Any] = []
    client.notebook.ycells.observe(lambda event: cell_list_changes.append(event.delta))
    # Run twice: the second run replaces the outputs of the first in place.
    for _ in range(2):
        live = await run(api, "kinds-live.ipynb", all=True, stop_on_error=False)
        expected = await run(api, "kinds-file.ipynb", all=True, stop_on_error=False)
        assert [c["status"] for c in live["cells"]] == ["complete"] * 4 + ["error"]
        # The live document serializes to exactly the bytes the file run wrote.
        status, read = await api("GET", "notebooks", "kinds-live.ipynb")
        assert status == 200
        assert read["hash"] == live["hash"] == expected["hash"]
        file_nb = nbformat.read(str(jp_root_dir / "kinds-file.ipynb"), as_version=4)
        counts = [len(c.outputs) for c in file_nb.cells]
        await until(
            lambda n=counts: [len(c["outputs"]) for c in client.notebook.get()["cells"]] == n,
            "the client to hold the run's outputs",
        )
    assert cell_list_changes == []
    await until(
        lambda: (
            (jp_root_dir / "kinds-live.ipynb").read_bytes() == (jp_root_dir / "kinds-file.ipynb").read_bytes()
        ),
        "the room to save the same bytes as the file run",
    )


def _text(output: dict[str, Any]) -> str:
    value = (output.get("data") or {}).get("text/plain", "")
    return "".join(value) if isinstance(value, list) else str(value)


async def test_a_flood_reaches_the_room_bounded_by_max_run_cell_bytes(api, jp_root_dir, connect):
    """While the cell still runs, the live document holds what the cell may store (4 MiB by default) and
    the placeholder for the rest, not the 6 MB the kernel displayed."""
    flag = jp_root_dir.parent / "flood.flag"
    code = (
        "import os, time\nfrom IPython.display import display\n"
        "for i in range(300):\n"
        "    display({'text/plain': f'{i:04d}' + 'z' * 20_000}, raw=True)\n"
        f"while not os.path.exists({str(flag)!r}):\n"
        "    time.sleep(0.02)"
    )
    nb = new_notebook(cells=[new_code_cell(code, id="c0")], metadata={"kernelspec": dict(KERNELSPEC)})
    (jp_root_dir / "flood-live.ipynb").write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
    client = await connect("flood-live.ipynb")
    running = asyncio.create_task(run(api, "flood-live.ipynb", cell_ids=["c0"], timeout=120))

    def all_displayed() -> bool:
        outputs = live_outputs(client, 0)
        return bool(outputs) and f"{300 - (len(outputs) - 1)} outputs" in _text(outputs[-1])

    try:
        await until(all_displayed, "the room to hold the bounded outputs and the placeholder", timeout=60)
        assert not running.done()
        outputs = live_outputs(client, 0)
        assert "NotebookRunner.max_cell_bytes_stored" in _text(outputs[-1])
        assert [_text(o)[:4] for o in outputs[:-1]] == [f"{i:04d}" for i in range(len(outputs) - 1)]
        assert len(json.dumps(outputs)) < 4 * 1024 * 1024 + 64 * 1024
    finally:
        flag.touch()
    answer = await asyncio.wait_for(running, 60)
    assert answer["cells"][0]["outputs_omitted"]["outputs"] == 300 - (len(outputs) - 1)


async def test_the_run_is_one_change_without_the_persons_edits_and_undoes_live(api, jp_root_dir, connect):
    flag = jp_root_dir.parent / "ledger.flag"
    make(jp_root_dir, "ledger.ipynb", flag)
    client = await connect("ledger.ipynb")
    running = asyncio.create_task(run(api, "ledger.ipynb", cell_ids=["c0"]))
    try:
        await until(lambda: live_outputs(client, 0) != [], "the first output to reach the client")
        client.type_at_end(2, "\nz += 1  # typed by a person")  # while the run writes outputs live

        async def server_has_edit() -> bool:
            _, read = await api("GET", "notebooks", "ledger.ipynb")
            return bool(read["cells"][2]["source"].endswith("# typed by a person"))

        await until(server_has_edit, "the person's edit to reach the room")
    finally:
        flag.touch()
    answer = await asyncio.wait_for(running, 30)
    assert answer["recorded"] is True
    status, listing = await api("GET", "notebooks", "ledger.ipynb", "changes")
    [entry] = listing["changes"]  # the run's clear, live pushes and final write: one change
    assert entry["id"] == answer["change_id"] and entry["kind"] == "run"
    assert [(c["id"], c["what"]) for c in entry["cells"]] == [("c0", ["outputs"])]  # not the person's edit
    status, undone = await api("POST", "notebooks", "ledger.ipynb", "changes", entry["id"], "undo")
    assert status == 200, undone
    await until(lambda: live_outputs(client, 0) == [], "the client to see the outputs the cell had before")
    assert live_count(client, 0) is None
    assert client.sources()[2] == "z = 3\nz += 1  # typed by a person"


async def test_insert_and_run_in_one_call_on_an_open_notebook(api, jp_root_dir, connect):
    """ops + run on a notebook open in a room: the person sees the new cell appear in place and its
    outputs arrive; the edit and the outputs are one change; the file the room saves has both."""
    path = make(jp_root_dir, "ins.ipynb", jp_root_dir.parent / "unused.flag")
    client = await connect("ins.ipynb")
    _, read = await api("GET", "notebooks", "ins.ipynb")
    ops = [{"action": "insert", "cell_index": 2, "cell_id": "added", "content": "print('added ran')"}]
    answer = await run(api, "ins.ipynb", ops=ops, expected_hash=read["hash"])
    assert [c["cell_id"] for c in answer["cells"]] == ["added"]
    assert answer["cells"][0]["output"] == "added ran\n" and answer["edit"]["hash"]
    await until(lambda: len(client.notebook.ycells) == 4, "the inserted cell to reach the client")
    assert client.notebook.ycells[2].to_py()["id"] == "added"
    expected = [{"output_type": "stream", "name": "stdout", "text": "added ran\n"}]
    await until(lambda: live_outputs(client, 2) == expected, "the new cell's outputs to reach the client")
    assert live_outputs(client, 0) == []  # the other cells did not run
    _, changes = await api("GET", "notebooks", "ins.ipynb", "changes")
    newest = changes["changes"][0]
    assert newest["id"] == answer["change_id"] and newest["kind"] == "run"

    def saved() -> bool:
        nb = read_file(path)
        return nb is not None and len(nb.cells) == 4 and nb.cells[2].outputs == expected

    await until(saved, "the room to save the new cell with its outputs")
