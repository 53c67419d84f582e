"""The pure notebook core without a server: request parsing, cell operations, serialization, summaries."""

from __future__ import annotations

import copy
import hashlib
import json
import random
from typing import Any

import hypothesis
import nbformat
import pytest
from hypothesis import strategies as st
from nbformat.v4 import (
    new_code_cell,
    new_markdown_cell,
    new_notebook,
    new_output,
    new_raw_cell,
)
from samples import PNG, PNG_BYTES, sample_notebook

from jupyter_agent_tools.errors import BadRequest
from jupyter_agent_tools.notebook.format import (
    content_hash,
    join_source,
    parse_notebook,
    serialize_notebook,
    split_source,
)
from jupyter_agent_tools.notebook.operations import (
    CellOp,
    apply_ops,
    check_supported,
    has_cell_ids,
    parse_edit_request,
)
from jupyter_agent_tools.notebook.summary import (
    summarize_cell,
    summarize_notebook,
    summarize_output,
    truncate_text,
)

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel

SEED = "0" * 64


# --------------------------------------------------------------------------------------------- helpers


def make_nb(minor: int = 5) -> nbformat.NotebookNode:
    """A notebook as nbformat makes it: every cell type, outputs of every kind, unicode."""
    return sample_notebook(minor, unicode=True)


def on_disk(nb: nbformat.NotebookNode) -> dict[str, Any]:
    """The notebook dict as the store holds it: parsed from the bytes nbformat writes."""
    return parse_notebook(nbformat.writes(nb) + "\n", "test.ipynb")


def ops(*raw: dict[str, Any]) -> list[CellOp]:
    body = raw[0] if len(raw) == 1 else {"ops": list(raw)}
    return parse_edit_request(body).ops


def run(nb: dict[str, Any], *raw: dict[str, Any], seed: str = SEED):
    return apply_ops(nb, ops(*raw), id_seed=seed)


def validate(nb: dict[str, Any]) -> None:
    nbformat.validate(nbformat.from_dict(copy.deepcopy(nb)))


def sources(nb: dict[str, Any]) -> list[str]:
    return [join_source(c["source"]) for c in nb["cells"]]


# ---------------------------------------------------------------------------------------- format.py


@pytest.mark.parametrize(
    ("content", "lines"),
    [
        ("", []),
        ("a", ["a"]),
        ("a\n", ["a\n"]),
        ("a\nb", ["a\n", "b"]),
        ("a\nb\n", ["a\n", "b\n"]),
        ("\n", ["\n"]),
        ("\n\n", ["\n", "\n"]),
        ("a\n\nb", ["a\n", "\n", "b"]),
        ("x = 1\r\ny = 2", ["x = 1\r\n", "y = 2"]),
        ("é😀\nü", ["é😀\n", "ü"]),
    ],
)
def test_split_source(content: str, lines: list[str]) -> None:
    assert split_source(content) == lines
    assert join_source(lines) == content


def test_split_source_invariants_on_random_text() -> None:
    rng = random.Random(1)
    alphabet = ["a", "b", " ", "\n", "\n", "é", "😀", "\t", "\r\n"]
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 30)))
        lines = split_source(text)
        assert "".join(lines) == text
        assert "" not in lines  # no empty trailing (or other) element
        for line in lines[:-1]:
            assert line.endswith("\n") and "\n" not in line[:-1]
        if lines:
            assert "\n" not in lines[-1][:-1]
            assert lines[-1].endswith("\n") == text.endswith("\n")  # no forced newline on the last


def test_join_source_and_hash() -> None:
    assert join_source("abc") == "abc"
    assert join_source(["a\n", "b"]) == "a\nb"
    assert join_source([]) == ""
    assert content_hash(b"x") == hashlib.sha256(b"x").hexdigest()


@pytest.mark.parametrize("minor", [0, 1, 2, 3, 4, 5])
def test_serialize_matches_nbformat_bytes(minor: int, tmp_path) -> None:
    nb = make_nb(minor)
    text = nbformat.writes(nb)
    assert serialize_notebook(parse_notebook(text, "x.ipynb")) == text + "\n"
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, str(path))
    data = path.read_bytes()
    assert serialize_notebook(parse_notebook(data.decode("utf-8"), "x.ipynb")).encode("utf-8") == data


def test_serialize_matches_nbformat_for_empty_and_unicode_metadata() -> None:
    nb = new_notebook(metadata={"title": "Über 😀", "authors": [{"name": "Zoë"}]})
    text = nbformat.writes(nb)
    assert serialize_notebook(parse_notebook(text, "x.ipynb")) == text + "\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "Invalid JSON in notebook: p.ipynb: "),
        ("[]", "Invalid notebook structure (missing cells array): p.ipynb"),
        ('{"nbformat": 4}', "Invalid notebook structure (missing cells array): p.ipynb"),
        ('{"cells": {}}', "Invalid notebook structure (missing cells array): p.ipynb"),
        ('{"cells": [1]}', "Invalid notebook structure (cells must be objects): p.ipynb"),
    ],
)
def test_parse_notebook_errors(text: str, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_notebook(text, "p.ipynb")
    assert info.value.message.startswith(message)
    assert info.value.status == 400


# ------------------------------------------------------------------------------- parse_edit_request


def test_parse_single_and_batch() -> None:
    req = parse_edit_request({"action": "insert", "content": "x", "expected_hash": "h"})
    assert req.ops == [CellOp(action="insert", content="x")]
    assert req.expected_hash == "h" and not req.batch
    req = parse_edit_request(
        {"ops": [{"action": "delete", "cell_index": 0}, {"action": "move", "cell_id": "a", "to_index": 2}]}
    )
    assert req.batch and req.expected_hash is None
    assert req.ops == [
        CellOp(action="delete", cell_index=0),
        CellOp(action="move", cell_id="a", to_index=2),
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "Request body must be a JSON object"),
        ({"action": "insert", "content": "x", "expected_hash": 1}, "'expected_hash' must be a string"),
        ({"ops": [], "action": "edit"}, "unknown field 'action' next to 'ops'"),
        ({"ops": []}, "'ops' must be a non-empty array of operations"),
        ({"ops": {"action": "insert"}}, "'ops' must be a non-empty array of operations"),
        ({}, "'action' is required (one of: edit, insert, delete, move, clear_outputs, replace)"),
        (
            {"action": "paste"},
            "unknown action 'paste' (expected one of: edit, insert, delete, move, clear_outputs, replace)",
        ),
        ({"action": "edit", "cell_index": 0}, "Content is required for edit action"),
        ({"action": "insert"}, "Content is required for insert action"),
        ({"action": "edit", "content": "x"}, "'cell_index' or 'cell_id' is required for edit action"),
        ({"action": "delete"}, "'cell_index' or 'cell_id' is required for delete action"),
        ({"action": "move", "cell_index": 0}, "'to_index' is required for move action"),
        ({"action": "edit", "cell_index": 0, "content": "", "to_index": 1}, "'to_index' is only used by"),
        ({"action": "delete", "cell_index": 0, "content": "x"}, "'content' is not used by the delete"),
        ({"action": "move", "cell_index": 0, "to_index": 1, "cell_type": "raw"}, "'cell_type' is not used"),
        ({"action": "edit", "cell_index": "0", "content": ""}, "'cell_index' must be an integer, got str"),
        ({"action": "edit", "cell_index": True, "content": ""}, "'cell_index' must be an integer, got bool"),
        ({"action": "edit", "cell_index": 1.0, "content": ""}, "'cell_index' must be an integer, got float"),
        ({"action": "move", "cell_index": 0, "to_index": "1"}, "'to_index' must be an integer, got str"),
        ({"action": "insert", "content": ["a"]}, "'content' must be a string, got list"),
        ({"action": "delete", "cell_id": 3}, "'cell_id' must be a string, got int"),
        ({"action": "insert", "content": "", "cell_type": "heading"}, "unknown cell_type 'heading'"),
        ({"action": "insert", "content": "", "cell_type": 1}, "'cell_type' must be a string, got int"),
        ({"action": "insert", "content": "", "cell_id": "a b"}, "'cell_id' for a new cell must be 1-64"),
        ({"action": "insert", "content": "", "cell_id": "x" * 65}, "'cell_id' for a new cell must be 1-64"),
        ({"action": "insert", "content": "", "source": "x"}, "unknown field 'source' (allowed: action,"),
    ],
)
def test_parse_errors(body: Any, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_edit_request(body)
    assert message in info.value.message
    assert info.value.status == 400


def test_parse_batch_errors_name_the_op() -> None:
    with pytest.raises(BadRequest) as info:
        parse_edit_request(
            {"ops": [{"action": "insert", "content": "x"}, {"action": "edit", "cell_index": 0}]}
        )
    assert info.value.message == "ops[1]: Content is required for edit action"
    with pytest.raises(BadRequest) as info:
        parse_edit_request({"ops": [{"action": "insert", "content": "x"}, "delete"]})
    assert info.value.message.startswith("ops[1]: must be a JSON object")


def test_parse_max_ops() -> None:
    op = {"action": "insert", "content": "x"}
    assert len(parse_edit_request({"ops": [op] * 3}, max_ops=3).ops) == 3
    with pytest.raises(BadRequest, match="'ops' has 4 operations; at most 3 are allowed"):
        parse_edit_request({"ops": [op] * 4}, max_ops=3)


def test_supported_formats() -> None:
    assert has_cell_ids(on_disk(make_nb(5)))
    assert not has_cell_ids(on_disk(make_nb(4)))
    check_supported(on_disk(make_nb(4)), "x.ipynb")
    with pytest.raises(BadRequest, match=r"Unsupported notebook format in x.ipynb: nbformat 3"):
        check_supported({"nbformat": 3, "cells": []}, "x.ipynb")


# ---------------------------------------------------------------------------------------- apply_ops

EVERY_ACTION = [
    {"action": "insert", "cell_index": 1, "content": "new"},
    {"action": "insert", "content": "t", "cell_type": "markdown"},
    {"action": "edit", "cell_index": 2, "content": "changed"},
    {"action": "edit", "cell_id": "cell-1", "content": "# md", "cell_type": "markdown"},
    {"action": "edit", "cell_index": 0, "content": "code", "cell_type": "code"},
    {"action": "delete", "cell_index": 3},
    {"action": "move", "cell_index": 4, "to_index": 0},
]


@pytest.mark.parametrize("op", EVERY_ACTION, ids=lambda op: f"{op['action']}-{op.get('cell_type')}")
def test_input_never_mutated_and_untouched_cells_identical(op: dict[str, Any]) -> None:
    nb = on_disk(make_nb())
    before = copy.deepcopy(nb)
    cells_before = list(nb["cells"])
    result = run(nb, op).notebook
    assert nb == before
    assert all(a is b for a, b in zip(nb["cells"], cells_before, strict=True))
    assert result is not nb and result["cells"] is not nb["cells"]
    touched = None
    if op["action"] in ("edit", "delete"):
        touched = op["cell_index"] if "cell_index" in op else int(op["cell_id"].split("-")[1])
    result_cells = {id(c) for c in result["cells"]}
    for i, cell in enumerate(cells_before):
        assert (id(cell) in result_cells) == (i != touched), i
    validate(result)


def test_untouched_cells_serialize_to_the_same_bytes() -> None:
    nb = on_disk(make_nb())
    before = serialize_notebook(nb).splitlines()
    after = serialize_notebook(
        run(nb, {"action": "edit", "cell_id": "cell-2", "content": "plot(1)"}).notebook
    )
    changed = [a for a, b in zip(before, after.splitlines(), strict=True) if a != b]
    assert changed == ['    "plot()"']


def test_failing_batch_names_the_op_and_changes_nothing() -> None:
    nb = on_disk(make_nb())
    before = copy.deepcopy(nb)
    with pytest.raises(BadRequest) as info:
        run(
            nb,
            {"action": "insert", "content": "x"},
            {"action": "delete", "cell_index": 0},
            {"action": "edit", "cell_index": 99, "content": "y"},
        )
    assert info.value.message == (
        "ops[2]: Cell index 99 is out of range for edit (valid range: 0..4, notebook has 5 cells) "
        "(no operation was applied)"
    )
    assert nb == before


def test_single_op_error_has_no_prefix() -> None:
    with pytest.raises(BadRequest) as info:
        run(on_disk(make_nb()), {"action": "delete", "cell_index": 5})
    assert (
        info.value.message
        == "Cell index 5 is out of range for delete (valid range: 0..4, notebook has 5 cells)"
    )


def test_batch_of_one_failing_op_names_ops0() -> None:
    request = parse_edit_request({"ops": [{"action": "delete", "cell_index": 5}]})
    with pytest.raises(BadRequest) as info:
        apply_ops(on_disk(make_nb()), request.ops, id_seed=SEED, batch=request.batch)
    assert info.value.message.startswith("ops[0]: ")


def test_batch_applies_in_order_with_summary_message() -> None:
    outcome = run(
        on_disk(make_nb()),
        {"action": "insert", "cell_index": 0, "content": "first"},
        {"action": "delete", "cell_index": 1},
        {"action": "move", "cell_index": 0, "to_index": 4},
    )
    assert outcome.message == "Applied 3 operations. Notebook now has 5 cells."
    assert [o.details["action"] for o in outcome.outcomes] == ["insert", "delete", "move"]
    assert sources(outcome.notebook)[4] == "first"
    assert outcome.outcomes[1].details["cellSource"].startswith("# Titre")


def test_insert_code_cell() -> None:
    nb = on_disk(make_nb())
    outcome = run(nb, {"action": "insert", "cell_index": 1, "content": "a = 1\nb = 2\n"})
    cell = outcome.notebook["cells"][1]
    assert set(cell) == {"cell_type", "execution_count", "id", "metadata", "outputs", "source"}
    assert cell["cell_type"] == "code" and cell["execution_count"] is None and cell["outputs"] == []
    assert cell["metadata"] == {} and cell["source"] == ["a = 1\n", "b = 2\n"]
    assert outcome.message == "Inserted code cell at index 1. Notebook now has 6 cells."
    assert outcome.outcomes[0].details == {
        "action": "insert",
        "cellIndex": 1,
        "cellId": cell["id"],
        "cellType": "code",
        "totalCells": 6,
        "cellSource": "a = 1\nb = 2\n",
    }
    validate(outcome.notebook)


@pytest.mark.parametrize("cell_type", ["markdown", "raw"])
def test_insert_markdown_and_raw_get_only_metadata_source_id(cell_type: str) -> None:
    outcome = run(on_disk(make_nb()), {"action": "insert", "content": "text", "cell_type": cell_type})
    cell = outcome.notebook["cells"][-1]
    assert set(cell) == {"cell_type", "id", "metadata", "source"}
    assert outcome.outcomes[0].details["cellIndex"] == 5  # default: append
    validate(outcome.notebook)


def test_insert_range_and_empty_notebook() -> None:
    nb = on_disk(new_notebook())
    assert sources(run(nb, {"action": "insert", "cell_index": 0, "content": "x"}).notebook) == ["x"]
    with pytest.raises(
        BadRequest, match=r"out of range for insert \(valid range: 0..0, notebook has 0 cells"
    ):
        run(nb, {"action": "insert", "cell_index": 1, "content": "x"})
    with pytest.raises(BadRequest, match="no cells"):
        run(nb, {"action": "edit", "cell_index": 0, "content": "x"})
    full = on_disk(make_nb())
    assert sources(run(full, {"action": "insert", "cell_index": 5, "content": "end"}).notebook)[5] == "end"
    for index in (-1, 6):
        with pytest.raises(BadRequest, match=r"valid range: 0..5, notebook has 5 cells"):
            run(full, {"action": "insert", "cell_index": index, "content": "x"})


def test_insert_on_old_minor_has_no_id() -> None:
    nb = on_disk(make_nb(4))
    outcome = run(nb, {"action": "insert", "content": "x"})
    assert "id" not in outcome.notebook["cells"][-1]
    assert outcome.outcomes[0].details["cellId"] is None
    validate(outcome.notebook)
    with pytest.raises(BadRequest, match="no cell ids"):
        run(nb, {"action": "insert", "content": "x", "cell_id": "mine"})
    with pytest.raises(BadRequest, match="address cells by 'cell_index'"):
        run(nb, {"action": "delete", "cell_id": "cell-0"})


def test_insert_with_caller_id() -> None:
    nb = on_disk(make_nb())
    assert (
        run(nb, {"action": "insert", "content": "x", "cell_id": "mine"}).notebook["cells"][-1]["id"] == "mine"
    )
    with pytest.raises(BadRequest, match="Cell id 'cell-3' already exists in notebook"):
        run(nb, {"action": "insert", "content": "x", "cell_id": "cell-3"})


def test_derived_ids_deterministic_unique_and_seeded() -> None:
    nb = on_disk(make_nb())
    batch = [{"action": "insert", "cell_index": i % 3, "content": str(i)} for i in range(300)]
    first = run(nb, *batch, seed="a").notebook
    again = run(nb, *batch, seed="a").notebook
    other = run(nb, *batch, seed="b").notebook
    ids = [c["id"] for c in first["cells"]]
    assert ids == [c["id"] for c in again["cells"]]
    assert serialize_notebook(first) == serialize_notebook(again)
    assert len(set(ids)) == len(ids) == 305
    new_ids = set(ids) - {f"cell-{i}" for i in range(5)}
    assert new_ids.isdisjoint({c["id"] for c in other["cells"]})
    assert all(len(i) == 8 and all(ch in "0123456789abcdef" for ch in i) for i in new_ids)
    validate(first)


def test_derived_id_avoids_existing_ids() -> None:
    nb = on_disk(make_nb())
    derived = run(nb, {"action": "insert", "content": "x"}).notebook["cells"][-1]["id"]
    clash = copy.deepcopy(nb)
    clash["cells"][0]["id"] = derived
    new_id = run(clash, {"action": "insert", "content": "x"}).notebook["cells"][-1]["id"]
    assert new_id != derived
    assert new_id == run(clash, {"action": "insert", "content": "x"}).notebook["cells"][-1]["id"]


def test_edit_keeps_type_outputs_and_count() -> None:
    nb = on_disk(make_nb())
    outcome = run(nb, {"action": "edit", "cell_index": 2, "content": "plot(2)"})
    cell = outcome.notebook["cells"][2]
    old = nb["cells"][2]
    assert cell["source"] == ["plot(2)"]
    assert cell["outputs"] is old["outputs"] and cell["execution_count"] == 2 and cell["id"] == "cell-2"
    assert outcome.message == "Edited code cell at index 2. Notebook has 5 cells."
    assert "previousCellType" not in outcome.outcomes[0].details


def test_edit_code_to_markdown_drops_outputs_and_count() -> None:
    outcome = run(
        on_disk(make_nb()),
        {"action": "edit", "cell_id": "cell-2", "content": "## Plot", "cell_type": "markdown"},
    )
    cell = outcome.notebook["cells"][2]
    assert set(cell) == {"cell_type", "id", "metadata", "source"}
    assert cell["cell_type"] == "markdown"
    assert outcome.message == (
        "Edited cell at index 2 and converted it from code to markdown. Notebook has 5 cells."
    )
    details = outcome.outcomes[0].details
    assert details["previousCellType"] == "code" and details["cellType"] == "markdown"
    validate(outcome.notebook)


def test_edit_markdown_with_attachments_to_code_drops_attachments() -> None:
    nb = on_disk(make_nb())
    assert "attachments" in nb["cells"][0]
    cell = run(nb, {"action": "edit", "cell_index": 0, "content": "x", "cell_type": "code"}).notebook[
        "cells"
    ][0]
    assert set(cell) == {"cell_type", "execution_count", "id", "metadata", "outputs", "source"}
    assert cell["execution_count"] is None and cell["outputs"] == []
    assert "attachments" in nb["cells"][0]  # the input is untouched


def test_edit_markdown_to_raw_keeps_attachments_and_validates() -> None:
    outcome = run(on_disk(make_nb()), {"action": "edit", "cell_index": 0, "content": "r", "cell_type": "raw"})
    cell = outcome.notebook["cells"][0]
    assert cell["cell_type"] == "raw" and "attachments" in cell
    validate(outcome.notebook)


def test_edit_same_cell_type_is_not_a_conversion() -> None:
    outcome = run(
        on_disk(make_nb()), {"action": "edit", "cell_index": 1, "content": "y", "cell_type": "code"}
    )
    assert outcome.notebook["cells"][1]["execution_count"] == 1
    assert outcome.message.startswith("Edited code cell at index 1.")


def test_edit_addressing_errors() -> None:
    nb = on_disk(make_nb())
    with pytest.raises(BadRequest, match="Cell id 'nope' not found in notebook"):
        run(nb, {"action": "edit", "cell_id": "nope", "content": "x"})
    with pytest.raises(BadRequest, match=r"'cell_index' 0 and 'cell_id' 'cell-2' name different cells"):
        run(nb, {"action": "edit", "cell_id": "cell-2", "cell_index": 0, "content": "x"})
    assert (
        sources(run(nb, {"action": "edit", "cell_id": "cell-2", "cell_index": 2, "content": "x"}).notebook)[2]
        == "x"
    )


def test_delete_returns_removed_source() -> None:
    nb = on_disk(make_nb())
    outcome = run(nb, {"action": "delete", "cell_id": "cell-1"})
    assert outcome.message == "Deleted code cell at index 1. Notebook now has 4 cells."
    details = outcome.outcomes[0].details
    assert details["cellSource"] == "import math\nprint(math.pi)"
    assert details["cellId"] == "cell-1" and details["totalCells"] == 4
    assert [c["id"] for c in outcome.notebook["cells"]] == ["cell-0", "cell-2", "cell-3", "cell-4"]


@pytest.mark.parametrize(("src", "dst"), [(0, 4), (4, 0), (1, 3), (3, 1), (2, 2), (0, 1), (1, 0)])
def test_move_semantics(src: int, dst: int) -> None:
    nb = on_disk(make_nb())
    outcome = run(nb, {"action": "move", "cell_index": src, "to_index": dst})
    expected = [f"cell-{i}" for i in range(5)]
    expected.insert(dst, expected.pop(src))
    assert [c["id"] for c in outcome.notebook["cells"]] == expected
    assert outcome.notebook["cells"][dst] is nb["cells"][src]
    details = outcome.outcomes[0].details
    assert details["cellIndex"] == dst and details["fromIndex"] == src
    assert outcome.message.startswith(
        f"Moved {nb['cells'][src]['cell_type']} cell from index {src} to index {dst}."
    )


def test_move_range() -> None:
    nb = on_disk(make_nb())
    for to in (-1, 5):
        with pytest.raises(BadRequest, match=rf"to_index {to} is out of range for move \(valid range: 0..4"):
            run(nb, {"action": "move", "cell_index": 0, "to_index": to})


# ---------------------------------------------------------------------------- canonical form (nbformat)


def resaved_by_nbformat(text: str) -> str:
    """What JupyterLab / the contents API write after reading ``text``: nbformat.reads then writes."""
    return nbformat.writes(nbformat.reads(text, as_version=nbformat.NO_CONVERT)) + "\n"


def test_edited_notebook_is_in_nbformat_canonical_form() -> None:
    nb = on_disk(make_nb())
    outcome = run(
        nb,
        {"action": "edit", "cell_index": 1, "content": "é = 1\r\nprint('😀')\n\n"},
        {"action": "insert", "content": "# T\n", "cell_type": "markdown"},
    )
    text = serialize_notebook(outcome.notebook)
    assert resaved_by_nbformat(text) == text


@pytest.mark.parametrize("sep", ["\r", "\u2028", "\x0c"])
def test_edit_with_other_line_separators_is_canonical(sep: str) -> None:
    outcome = run(on_disk(make_nb()), {"action": "edit", "cell_index": 1, "content": f"a{sep}b\nc"})
    text = serialize_notebook(outcome.notebook)
    assert resaved_by_nbformat(text) == text


# --------------------------------------------------------------------------------------- summary.py


def test_truncate_text() -> None:
    assert truncate_text("abcdef", 0) == "abcdef"
    assert truncate_text("abcdef", 6) == "abcdef"
    assert truncate_text("abcdef", 4) == "abcd\n[... truncated 2 more characters]"


def test_summarize_outputs() -> None:
    nb = on_disk(make_nb())
    stream = summarize_output(nb["cells"][1]["outputs"][0], 10, False)
    assert stream == {
        "output_type": "stream",
        "name": "stdout",
        "text": "3.14159265\n[... truncated 17 more characters]",
    }
    display, result = (summarize_output(o, 100, False) for o in nb["cells"][2]["outputs"])
    assert display == {
        "output_type": "display_data",
        "text": "<Figure size 640x480>",
        "data": [{"mime": "image/png", "bytes": len(PNG_BYTES)}],
    }
    html = "<b>gras</b>\n<i>ü</i>"
    assert result == {
        "output_type": "execute_result",
        "execution_count": 2,
        "text": "Bold",
        "data": [{"mime": "text/html", "bytes": len(html.encode())}],
    }
    with_binary = summarize_output(nb["cells"][2]["outputs"][0], 100, True)
    assert with_binary["data"] == [{"mime": "image/png", "bytes": len(PNG_BYTES), "data": PNG}]
    error = summarize_output(nb["cells"][3]["outputs"][0], 100, False)
    assert error == {
        "output_type": "error",
        "ename": "ZeroDivisionError",
        "evalue": "division by zero",
        "traceback": "ZeroDivisionError: division by zero",
    }


def test_summarize_prefers_markdown_text_and_strips_stream_ansi() -> None:
    out = {
        "output_type": "display_data",
        "data": {"text/markdown": "**m**", "text/plain": "m"},
        "metadata": {},
    }
    assert summarize_output(out, 0, False) == {"output_type": "display_data", "text": "**m**"}
    stream = {"output_type": "stream", "name": "stderr", "text": ["\x1b[1mwarn\x1b[0m\n"]}
    assert summarize_output(stream, 0, False)["text"] == "warn\n"


def test_summarize_cells_and_notebook() -> None:
    nb = on_disk(make_nb())
    md = summarize_cell(nb["cells"][0], 0, 100, False)
    assert md == {
        "index": 0,
        "id": "cell-0",
        "cell_type": "markdown",
        "source": "# Titre — été 😀\n\n![x](attachment:x.png)",
        "execution_count": None,
    }
    summary = summarize_notebook(nb, "a/b.ipynb", "h", 100)
    assert {k: summary[k] for k in ("path", "nbformat", "nbformat_minor", "hash")} == {
        "path": "a/b.ipynb",
        "nbformat": 4,
        "nbformat_minor": 5,
        "hash": "h",
    }
    assert [c["index"] for c in summary["cells"]] == [0, 1, 2, 3, 4]
    assert "outputs" not in summary["cells"][4] and summary["cells"][1]["execution_count"] == 1
    assert PNG not in json.dumps(summary)
    assert PNG in json.dumps(summarize_notebook(nb, "a/b.ipynb", "h", 100, include_binary=True))


# ------------------------------------------------------------------------------ random property test

ALPHABET = ["a", "b", "x = 1", " ", "\n", "\n", "é", "😀", "\t", "#"]


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 12)))


def random_notebook(rng: random.Random) -> dict[str, Any]:
    minor = rng.choice([4, 5])
    cells = []
    for i in range(rng.randrange(0, 8)):
        kind = rng.choice(["code", "markdown", "raw"])
        if kind == "code":
            outputs = []
            if rng.random() < 0.5:
                outputs.append(new_output("stream", name="stdout", text=random_text(rng)))
            if rng.random() < 0.3:
                outputs.append(new_output("display_data", data={"image/png": PNG, "text/plain": "fig"}))
            cell = new_code_cell(random_text(rng), execution_count=rng.choice([None, i + 1]), outputs=outputs)
        elif kind == "markdown":
            cell = new_markdown_cell(random_text(rng))
        else:
            cell = new_raw_cell(random_text(rng))
        cell["id"] = f"c{i}"
        cells.append(cell)
    nb = new_notebook(cells=cells)
    nb.nbformat_minor = minor
    if minor < 5:
        for cell in nb.cells:
            del cell["id"]
    return on_disk(nb)


def random_ops(rng: random.Random, nb: dict[str, Any]) -> list[dict[str, Any]]:
    """A valid sequence of operations, tracking the cell count and the ids known in advance."""
    with_ids = has_cell_ids(nb)
    known: list[str | None] = [c.get("id") for c in nb["cells"]]
    result = []
    for n_op in range(rng.randrange(1, 10)):
        n = len(known)
        action = rng.choice(["insert"] if n == 0 else ["insert", "edit", "delete", "move"])
        op: dict[str, Any] = {"action": action}
        if action == "insert":
            index = rng.randrange(0, n + 1)
            if rng.random() < 0.8:
                op["cell_index"] = index
            else:
                index = n
            op["content"] = random_text(rng)
            if rng.random() < 0.5:
                op["cell_type"] = rng.choice(["code", "markdown", "raw"])
            new_id = None
            if with_ids and rng.random() < 0.3:
                new_id = op["cell_id"] = f"new-{n_op}"
            known.insert(index, new_id)
            result.append(op)
            continue
        index = rng.randrange(0, n)
        if known[index] is not None and rng.random() < 0.5:
            op["cell_id"] = known[index]
        else:
            op["cell_index"] = index
        if action == "edit":
            op["content"] = random_text(rng)
            if rng.random() < 0.5:
                op["cell_type"] = rng.choice(["code", "markdown", "raw"])
        elif action == "delete":
            known.pop(index)
        else:
            to = op["to_index"] = rng.randrange(0, n)
            known.insert(to, known.pop(index))
        result.append(op)
    return result


def check_random_case(rng: random.Random) -> None:
    nb = random_notebook(rng)
    raw_ops = random_ops(rng, nb)
    before = copy.deepcopy(nb)
    parsed = parse_edit_request({"ops": raw_ops}).ops
    seed = content_hash(serialize_notebook(nb).encode())
    first = apply_ops(nb, parsed, id_seed=seed)
    second = apply_ops(nb, parsed, id_seed=seed)
    assert nb == before
    validate(first.notebook)
    text = serialize_notebook(first.notebook)
    assert text == serialize_notebook(second.notebook)
    assert resaved_by_nbformat(text) == text
    assert len(first.outcomes) == len(raw_ops)
    if has_cell_ids(nb):
        ids = [c["id"] for c in first.notebook["cells"]]
        assert len(ids) == len(set(ids))


def test_random_op_sequences_validate_and_are_deterministic() -> None:
    for seed in range(300):
        check_random_case(random.Random(seed))


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.randoms(use_true_random=False))
def test_hypothesis_op_sequences_validate_and_are_deterministic(rng: random.Random) -> None:
    check_random_case(rng)


def test_clear_outputs_of_one_cell_or_all() -> None:
    nb = on_disk(make_nb())
    one = apply_ops(nb, ops({"action": "clear_outputs", "cell_id": "cell-2"}), SEED)
    assert one.notebook["cells"][2]["outputs"] == [] and one.notebook["cells"][2]["execution_count"] is None
    assert one.notebook["cells"][1] is nb["cells"][1]  # untouched cells are the same objects
    assert one.message == "Cleared the outputs of code cell at index 2. Notebook has 5 cells."
    every = apply_ops(nb, ops({"action": "clear_outputs", "all": True}), SEED)
    assert all(c.get("outputs", []) == [] for c in every.notebook["cells"])
    assert every.outcomes[0].details["clearedCells"] == 3
    with pytest.raises(BadRequest, match="Cell 0 is a markdown cell: only code cells have outputs"):
        apply_ops(nb, ops({"action": "clear_outputs", "cell_index": 0}), SEED)
    assert nb["cells"][2]["outputs"]  # the input is never modified


def test_every_action_of_the_schema_has_its_method() -> None:
    """The editor dispatches through a table: an action added to the schema without a method (or a method
    left in the table for an action the schema dropped) fails here, not as a KeyError on a request."""
    from jupyter_agent_tools.notebook import operations
    from jupyter_agent_tools.schemas import ACTIONS

    assert sorted(operations._APPLY) == sorted(ACTIONS)
