"""The pure part of the change ledger: what a change did, its undo, what changed since a version.

No server: notebooks as dicts, the cell operations of the edit route, random batches (hypothesis).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_agent_tools.ledger.changes import diff, merge, summarize
from jupyter_agent_tools.ledger.since import Snapshot, attribute, compare, snapshot_of
from jupyter_agent_tools.ledger.undo import check_undo, conflicts, inverse
from jupyter_agent_tools.notebook.operations import CellOp, apply_ops

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


def notebook(n: int = 5) -> dict[str, Any]:
    cells = []
    for i in range(n):
        cell: dict[str, Any] = {
            "cell_type": "code",
            "id": f"c{i}",
            "metadata": {},
            "source": [f"x = {i}\n", "x"],
        }
        cell["execution_count"] = i + 1
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": [f"{i}\n"]}]
        cells.append(cell)
    if n > 1:
        cells[1] = {"cell_type": "markdown", "id": "c1", "metadata": {"tags": ["t"]}, "source": "# one"}
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def edited(nb: dict[str, Any], ops: list[CellOp]) -> dict[str, Any]:
    return apply_ops(nb, ops, id_seed="seed", batch=True).notebook


def test_a_batch_is_seen_cell_by_cell_and_undone_exactly() -> None:
    before = notebook()
    after = edited(
        before,
        [
            CellOp("edit", cell_id="c0", content="x = 10"),
            CellOp("insert", cell_index=2, content="new", cell_id="n"),
            CellOp("delete", cell_id="c3"),
            CellOp("move", cell_id="c4", to_index=0),
            CellOp("clear_outputs", cell_id="c2"),
        ],
    )
    change = diff(before, after)
    assert {c.id: c.what for c in change.cells} == {
        "c4": ["moved"],
        "c0": ["edited"],
        "n": ["inserted"],
        "c2": ["outputs"],
        "c3": ["deleted"],
    }
    assert summarize(change) == "edit 1 cell, insert 1, delete 1, move 1, outputs of 1"
    assert change.not_undoable is None
    assert conflicts(change.cells, after) == []
    assert inverse(change.cells, after) == before


def test_undo_checks_every_touched_cell_against_the_state_the_change_left() -> None:
    before = notebook()
    after = edited(before, [CellOp("edit", cell_id="c0", content="y"), CellOp("delete", cell_id="c2")])
    change = diff(before, after)
    later = copy.deepcopy(after)
    later["cells"][0]["metadata"]["person"] = True
    later["cells"][1]["source"] = "also changed, but not by the change: no conflict"
    later["cells"].append({**copy.deepcopy(before["cells"][2])})  # a cell with the deleted id again
    found = {c.id: c.what for c in conflicts(change.cells, later)}
    assert found == {"c0": "its metadata changed since", "c2": "a cell with this id was added again since"}
    gone = copy.deepcopy(after)
    del gone["cells"][0]
    assert [(c.id, c.what) for c in conflicts(change.cells, gone)] == [("c0", "it was deleted since")]


def test_undo_keeps_what_others_changed_elsewhere() -> None:
    before = notebook()
    after = edited(before, [CellOp("delete", cell_id="c2"), CellOp("edit", cell_id="c4", content="z")])
    change = diff(before, after)
    later = edited(after, [CellOp("insert", cell_index=0, content="person", cell_id="p")])
    undone = inverse(change.cells, later)
    assert [c["id"] for c in undone["cells"]] == ["p", "c0", "c1", "c2", "c3", "c4"]
    assert undone["cells"][5] == before["cells"][4] and undone["cells"][3] == before["cells"][2]


def ran(nb: dict[str, Any], *ids: str, count: int = 42) -> dict[str, Any]:
    """``nb`` after a run of cells ``ids``: new outputs and execution counts, as a run writes them."""
    cells = list(nb["cells"])
    for i, cell in enumerate(cells):
        if cell.get("id") in ids:
            out = [{"output_type": "stream", "name": "stdout", "text": f"ran {cell['id']} {count}\n"}]
            cells[i] = {**cell, "outputs": out, "execution_count": count}
    return {**nb, "cells": cells}


def test_undo_of_an_edit_run_since_restores_the_source_and_clears_the_outputs() -> None:
    before = notebook()
    after = edited(
        before,
        [
            CellOp("edit", cell_id="c0", content="x = 10"),
            CellOp("edit", cell_id="c1", content="print('now code')", cell_type="code"),
            CellOp("insert", cell_index=5, content="new", cell_id="n"),
            CellOp("move", cell_id="c4", to_index=0),
        ],
    )
    change = diff(before, after)
    later = ran(after, "c0", "c1", "n", "c4")  # "edit, then run": only the outputs changed since
    checked = check_undo(change.cells, later)
    assert checked.conflicts == [] and conflicts(change.cells, later) == []
    assert checked.outputs_cleared == ["c0", "c1"]  # the code they came from is undone; a move is not
    undone = inverse(change.cells, later, checked.outputs_cleared)
    assert [c["id"] for c in undone["cells"]] == ["c0", "c1", "c2", "c3", "c4"]  # the insert goes
    assert undone["cells"][0] == {**before["cells"][0], "outputs": [], "execution_count": None}
    assert undone["cells"][1] == before["cells"][1]  # markdown again: no outputs keys at all
    assert undone["cells"][2:4] == before["cells"][2:4]
    assert undone["cells"][4] == later["cells"][0]  # moved back, with the outputs of its run
    # the undo is itself undoable: its change gives back the run's outputs and the edited source
    redo = diff(later, undone)
    assert check_undo(redo.cells, undone).outputs_cleared == []
    assert inverse(redo.cells, undone) == later


def test_undo_still_refuses_when_more_than_new_outputs_changed_since() -> None:
    before = notebook()
    after = edited(
        before, [CellOp("edit", cell_id="c0", content="x = 10"), CellOp("edit", cell_id="c2", content="y")]
    )
    change = diff(before, after)
    later = edited(ran(after, "c0", "c2"), [CellOp("edit", cell_id="c0", content="someone else's")])
    later = edited(later, [CellOp("edit", cell_id="c2", content="y", cell_type="markdown")])
    assert {c.id: c.what for c in conflicts(change.cells, later)} == {
        "c0": "its source and outputs changed since",
        "c2": "its outputs and cell type changed since",
    }
    gone = edited(ran(after, "c0"), [CellOp("delete", cell_id="c0")])
    assert [(c.id, c.what) for c in conflicts(change.cells, gone)] == [("c0", "it was deleted since")]
    # a change that wrote the outputs itself (a run, a clear): newer outputs would be overwritten
    run = diff(before, ran(before, "c3"))
    found = check_undo(run.cells, ran(before, "c3", count=43))
    assert [(c.id, c.what) for c in found.conflicts] == [("c3", "its outputs changed since")]
    clear = edited(before, [CellOp("clear_outputs", cell_id="c3")])
    found = check_undo(diff(before, clear).cells, ran(clear, "c3"))
    assert [(c.id, c.what) for c in found.conflicts] == [("c3", "its outputs changed since")]
    assert found.outputs_cleared == []


def test_run_writes_merge_into_one_change_with_the_first_before() -> None:
    before = notebook()
    cleared = copy.deepcopy(before)
    cleared["cells"][0] = {**cleared["cells"][0], "outputs": [], "execution_count": None}
    cleared["cells"] = [cleared["cells"][0], *before["cells"][1:]]
    ran = {**cleared, "cells": list(cleared["cells"])}
    ran["cells"][0] = {
        **ran["cells"][0],
        "outputs": [{"output_type": "stream", "name": "stdout", "text": "9"}],
    }
    ran["cells"][0]["execution_count"] = 7
    change = merge(diff(before, cleared), diff(cleared, ran))
    [cell] = change.cells
    assert cell.what == ["outputs"]
    assert cell.before["outputs"] == {"outputs": before["cells"][0]["outputs"], "execution_count": 1}
    assert cell.after["outputs"]["execution_count"] == 7
    assert inverse(change.cells, ran) == before
    assert summarize(change, "run") == "run: outputs of 1 cell"


def test_notebooks_without_ids_are_recorded_not_undoable() -> None:
    before = notebook()
    for cell in before["cells"]:
        del cell["id"]
    before["nbformat_minor"] = 4
    after = edited(before, [CellOp("edit", cell_index=0, content="y")])
    change = diff(before, after)
    assert [c.what for c in change.cells] == [["edited"]] and change.not_undoable
    meta = {**notebook(), "metadata": {"x": 1}}
    assert diff(notebook(), meta).not_undoable


OPS = st.lists(
    st.one_of(
        st.builds(
            lambda i, t: CellOp("edit", cell_index=i, content=t), st.integers(0, 9), st.text(max_size=5)
        ),
        st.builds(lambda i: CellOp("insert", cell_index=i, content="new"), st.integers(0, 9)),
        st.builds(lambda i: CellOp("delete", cell_index=i), st.integers(0, 9)),
        st.builds(
            lambda i, j: CellOp("move", cell_index=i, to_index=j), st.integers(0, 9), st.integers(0, 9)
        ),
        st.builds(lambda i: CellOp("clear_outputs", cell_index=i), st.integers(0, 9)),
    ),
    min_size=1,
    max_size=6,
)


def _apply_valid(nb: dict[str, Any], ops: list[CellOp]) -> dict[str, Any]:
    """Apply the operations that apply, one by one (an invalid one is skipped)."""
    for position, op in enumerate(ops):
        try:
            nb = apply_ops(nb, [op], id_seed=f"s{position}").notebook
        except Exception:
            continue
    return nb


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS, n=st.integers(0, 7))
def test_any_change_is_undone_exactly_and_since_sees_it(ops: list[CellOp], n: int) -> None:
    before = notebook(n)
    after = _apply_valid(before, ops)
    change = diff(before, after)
    assert conflicts(change.cells, after) == []
    assert inverse(change.cells, after) == before
    # since: the same cells, seen through the remembered hashes only
    seen = compare(snapshot_of(before), snapshot_of(after))
    assert {c.id: c.what for c in seen} == {c.id: c.what for c in change.cells}


def test_snapshots_reuse_the_hashes_of_shared_cells_and_round_trip() -> None:
    before = notebook(6)
    after = edited(before, [CellOp("edit", cell_id="c3", content="changed")])
    base = snapshot_of(before)
    derived = snapshot_of(after, (before, base))
    assert derived == snapshot_of(after)
    assert Snapshot.decode(derived.encode()) == derived
    assert [(c.id, c.what) for c in compare(base, derived)] == [("c3", ["edited"])]


def test_since_credits_only_the_change_that_left_the_cell_as_it_is() -> None:
    before = notebook(3)
    after = edited(before, [CellOp("edit", cell_id="c0", content="agent"), CellOp("delete", cell_id="c2")])
    change = diff(before, after)
    entry = {
        "id": "5",
        "user": "agent",
        "via": "mcp",
        "by_id": {c.id: {"digest": list(c.digest) if c.digest else None} for c in change.cells},
    }
    person = edited(after, [CellOp("edit", cell_id="c1", content="person")])
    cells = attribute(compare(snapshot_of(before), snapshot_of(person)), [entry])
    assert {c["id"]: (c["user"], c["change_id"]) for c in cells} == {
        "c0": ("agent", "5"),
        "c1": (None, None),
        "c2": ("agent", "5"),
    }
    # the person then edits the agent's cell: no longer the agent's doing
    again = edited(person, [CellOp("edit", cell_id="c0", content="person too")])
    cells = attribute(compare(snapshot_of(before), snapshot_of(again)), [entry])
    assert {c["id"]: c["user"] for c in cells}["c0"] is None


def test_an_overwrite_is_the_agent_touched_cells_a_save_changed_and_nothing_else() -> None:
    from jupyter_agent_tools.ledger.overwrite import agent_state, overwritten, summary

    before = notebook(5)
    agent = edited(before, [CellOp("edit", cell_id="c2", content="agent"), CellOp("delete", cell_id="c3")])
    recorded = diff(before, agent)
    entry = [{"id": c.id, "digest": list(c.digest) if c.digest else None} for c in recorded.cells]
    state = agent_state([("7", entry)])
    assert set(state) == {"c2", "c3"} and state["c3"] == ("7", None)

    stale = copy.deepcopy(before)  # a page that never saw the agent's change
    stale["cells"][4]["source"] = "person"  # and the person's own edit
    stale["cells"][0]["outputs"] = []  # and outputs (JupyterLab rewrites them): not compared
    found = overwritten(state, agent, stale)
    assert found is not None
    change, ids = found
    assert ids == ["7"]
    assert {c.id: c.what for c in change.cells} == {"c2": ["edited"], "c3": ["inserted"]}
    assert change.not_undoable is None
    assert summary(change, ids) == "save over change 7: cells c2 (edited), c3 (inserted)"

    fresh = copy.deepcopy(agent)  # a page that follows the file: its save keeps the agent's cells
    fresh["cells"][0]["source"] = "person"
    assert overwritten(state, agent, fresh) is None
    # a file that no longer has the agent's version (someone changed it before): not this save's doing
    assert overwritten(state, before, stale) is None
