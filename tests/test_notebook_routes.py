"""The notebook routes against a real Jupyter server: every action, every error, bytes on disk."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output
from samples import PNG, sample_notebook, write_nb
from tornado import web


@pytest.fixture
def nb_path(jp_root_dir: Path) -> Path:
    return write_nb(jp_root_dir, "work/sample.ipynb", sample_notebook())


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_get_summarizes_cells_and_outputs(api, nb_path):
    status, body = await api("GET", "notebooks", "work/sample.ipynb")
    assert status == 200
    assert body["path"] == "work/sample.ipynb"
    assert (body["nbformat"], body["nbformat_minor"]) == (4, 5)
    assert body["hash"] == sha(nb_path)
    cells = body["cells"]
    assert [c["index"] for c in cells] == [0, 1, 2, 3, 4]
    assert [c["id"] for c in cells] == [f"cell-{i}" for i in range(5)]
    assert [c["cell_type"] for c in cells] == ["markdown", "code", "code", "code", "raw"]
    assert cells[1]["source"] == "import math\nprint(math.pi)"
    assert cells[1]["execution_count"] == 1
    assert cells[1]["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "3.141592653589793\n"}]
    display, result = cells[2]["outputs"]
    assert display["text"] == "<Figure size 640x480>"
    url = "/api/agent/notebooks/work/sample.ipynb/cells/cell-2/outputs/0?mime=image/png"
    assert display["data"] == [{"mime": "image/png", "bytes": 8 + 1024, "url": url}]
    assert PNG not in json.dumps(body)
    assert result["execution_count"] == 2 and result["text"] == "Bold"
    url = "/api/agent/notebooks/work/sample.ipynb/cells/cell-2/outputs/1?mime=text/html"
    assert result["data"] == [{"mime": "text/html", "bytes": len("<b>bold</b>"), "url": url}]
    error = cells[3]["outputs"][0]
    assert error["ename"] == "ZeroDivisionError"
    assert error["traceback"] == "ZeroDivisionError: division by zero"
    assert "outputs" not in cells[0]


async def test_get_strips_ansi_escapes_from_every_output_text(api, jp_root_dir):
    """Colors, titles and hyperlinks (as IPython, rich and pandas write them) never reach the agent."""
    red, reset, link, unlink = "\x1b[1;31m", "\x1b[0m", "\x1b]8;;https://example.org\x1b\\", "\x1b]8;;\x1b\\"
    nb = new_notebook(
        cells=[
            new_code_cell(
                "show()",
                outputs=[
                    new_output("stream", name="stderr", text=f"{red}warning{reset}\n"),
                    new_output(
                        "execute_result", execution_count=1, data={"text/plain": f"{red}result{reset}"}
                    ),
                    new_output("display_data", data={"text/plain": [f"{red}line 1{reset}\n", "line 2"]}),
                    new_output(
                        "display_data", data={"text/markdown": f"see {link}docs{unlink}", "text/plain": "x"}
                    ),
                    new_output(
                        "error",
                        ename=f"{red}ValueError{reset}",
                        evalue=f"bad {red}value{reset}\x1b]0;title\x07",
                        traceback=[f"{red}ValueError{reset}: bad value"],
                    ),
                ],
            )
        ]
    )
    write_nb(jp_root_dir, "ansi.ipynb", nb)
    status, body = await api("GET", "notebooks", "ansi.ipynb")
    assert status == 200
    assert body["cells"][0]["outputs"] == [
        {"output_type": "stream", "name": "stderr", "text": "warning\n"},
        {"output_type": "execute_result", "execution_count": 1, "text": "result"},
        {"output_type": "display_data", "text": "line 1\nline 2"},
        {"output_type": "display_data", "text": "see docs"},
        {
            "output_type": "error",
            "ename": "ValueError",
            "evalue": "bad value",
            "traceback": "ValueError: bad value",
        },
    ]


async def test_ansi_escapes_do_not_count_towards_truncation(api, jp_root_dir):
    colored = "\x1b[31mx\x1b[0m" * 3000
    outputs = [new_output("execute_result", execution_count=1, data={"text/plain": colored})]
    write_nb(jp_root_dir, "colored.ipynb", new_notebook(cells=[new_code_cell("x", outputs=outputs)]))
    status, body = await api("GET", "notebooks", "colored.ipynb")
    assert status == 200
    assert body["cells"][0]["outputs"][0]["text"] == "x" * 2000 + "\n[... truncated 1000 more characters]"


async def test_get_include_binary_returns_base64(api, nb_path):
    status, body = await api("GET", "notebooks", "work/sample.ipynb", params={"include_binary": "true"})
    assert status == 200
    assert body["cells"][2]["outputs"][0]["data"][0]["data"] == PNG


async def test_get_truncates_long_text_outputs(api, jp_root_dir):
    nb = new_notebook(
        cells=[
            new_code_cell(
                "print('x' * 10000)",
                outputs=[new_output("stream", name="stdout", text="x" * 10000)],
            )
        ]
    )
    write_nb(jp_root_dir, "long.ipynb", nb)
    status, body = await api("GET", "notebooks", "long.ipynb")
    assert status == 200
    text = body["cells"][0]["outputs"][0]["text"]
    assert text.startswith("x" * 2000)
    assert text.endswith("[... truncated 8000 more characters]")


async def test_insert_code_cell(api, nb_path):
    before = sha(nb_path)
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={"action": "insert", "cell_index": 1, "content": "a = 1\nb = 2\n"},
    )
    assert status == 200, body
    assert body["message"] == "Inserted code cell at index 1. Notebook now has 6 cells."
    details = body["details"]
    assert details["action"] == "insert" and details["cellIndex"] == 1
    assert details["cellType"] == "code" and details["totalCells"] == 6
    assert details["cellSource"] == "a = 1\nb = 2\n"
    assert body["hash"] == sha(nb_path) != before
    nb = json.loads(nb_path.read_text())
    cell = nb["cells"][1]
    assert cell["source"] == ["a = 1\n", "b = 2\n"]
    assert cell["outputs"] == [] and cell["execution_count"] is None
    assert cell["id"] == details["cellId"]
    assert len(cell["id"]) == 8
    nbformat.validate(nbformat.reads(nb_path.read_text(), as_version=4))


async def test_insert_markdown_and_raw_cells_have_only_metadata_and_source(api, nb_path):
    for cell_type in ("markdown", "raw"):
        status, body = await api(
            "POST",
            "notebooks",
            "work/sample.ipynb",
            body={"action": "insert", "cell_index": 0, "content": "x", "cell_type": cell_type},
        )
        assert status == 200, body
        cell = json.loads(nb_path.read_text())["cells"][0]
        assert sorted(cell) == ["cell_type", "id", "metadata", "source"]
        assert cell["cell_type"] == cell_type


async def test_insert_without_index_appends(api, nb_path):
    status, body = await api(
        "POST", "notebooks", "work/sample.ipynb", body={"action": "insert", "content": "last"}
    )
    assert status == 200
    assert body["details"]["cellIndex"] == 5
    assert json.loads(nb_path.read_text())["cells"][5]["source"] == ["last"]


async def test_insert_with_caller_cell_id(api, nb_path):
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={"action": "insert", "cell_index": 0, "content": "x", "cell_id": "my-id"},
    )
    assert status == 200
    assert json.loads(nb_path.read_text())["cells"][0]["id"] == "my-id"
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={"action": "insert", "cell_index": 0, "content": "y", "cell_id": "my-id"},
    )
    assert status == 400
    assert body["message"] == "Cell id 'my-id' already exists in notebook"


async def test_edit_keeps_type_and_outputs(api, nb_path):
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={"action": "edit", "cell_index": 1, "content": "print(2)"},
    )
    assert status == 200, body
    assert body["message"] == "Edited code cell at index 1. Notebook has 5 cells."
    cell = json.loads(nb_path.read_text())["cells"][1]
    assert cell["source"] == ["print(2)"]
    assert cell["outputs"][0]["text"] == ["3.141592653589793\n"]
    assert cell["execution_count"] == 1 and cell["id"] == "cell-1"


async def test_edit_by_cell_id(api, nb_path):
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={"action": "edit", "cell_id": "cell-4", "content": "new raw"},
    )
    assert status == 200, body
    assert body["details"]["cellIndex"] == 4 and body["details"]["cellId"] == "cell-4"
    assert json.loads(nb_path.read_text())["cells"][4]["source"] == ["new raw"]


async def test_edit_converts_cell_type(api, nb_path):
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={
            "action": "edit",
            "cell_index": 1,
            "content": "now *markdown*",
            "cell_type": "markdown",
        },
    )
    assert status == 200, body
    assert body["details"]["previousCellType"] == "code"
    cell = json.loads(nb_path.read_text())["cells"][1]
    assert sorted(cell) == ["cell_type", "id", "metadata", "source"]
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={"action": "edit", "cell_index": 0, "content": "x = 1", "cell_type": "code"},
    )
    assert status == 200, body
    cell = json.loads(nb_path.read_text())["cells"][0]
    assert cell["cell_type"] == "code" and cell["outputs"] == [] and cell["execution_count"] is None


async def test_delete_returns_removed_source(api, nb_path):
    status, body = await api(
        "POST", "notebooks", "work/sample.ipynb", body={"action": "delete", "cell_index": 0}
    )
    assert status == 200, body
    assert body["message"] == "Deleted markdown cell at index 0. Notebook now has 4 cells."
    assert body["details"]["cellSource"] == "# Title\n\nSome *text*."
    cells = json.loads(nb_path.read_text())["cells"]
    assert [c["id"] for c in cells] == ["cell-1", "cell-2", "cell-3", "cell-4"]


async def test_move(api, nb_path):
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={"action": "move", "cell_id": "cell-4", "to_index": 0},
    )
    assert status == 200, body
    assert body["message"] == "Moved raw cell from index 4 to index 0. Notebook has 5 cells."
    assert body["details"]["fromIndex"] == 4 and body["details"]["cellIndex"] == 0
    cells = json.loads(nb_path.read_text())["cells"]
    assert [c["id"] for c in cells] == ["cell-4", "cell-0", "cell-1", "cell-2", "cell-3"]


async def test_batch_is_atomic(api, nb_path):
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={
            "ops": [
                {"action": "insert", "cell_index": 0, "content": "first"},
                {"action": "edit", "cell_index": 1, "content": "edited title"},
                {"action": "delete", "cell_id": "cell-4"},
            ]
        },
    )
    assert status == 200, body
    assert body["message"] == "Applied 3 operations. Notebook now has 5 cells."
    assert [r["details"]["action"] for r in body["results"]] == ["insert", "edit", "delete"]
    cells = json.loads(nb_path.read_text())["cells"]
    assert cells[0]["source"] == ["first"] and cells[1]["source"] == ["edited title"]
    assert "cell-4" not in [c["id"] for c in cells]

    before = nb_path.read_bytes()
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={
            "ops": [
                {"action": "insert", "cell_index": 0, "content": "lost"},
                {"action": "delete", "cell_index": 99},
            ]
        },
    )
    assert status == 400
    assert body["message"].startswith("ops[1]: Cell index 99 is out of range for delete")
    assert nb_path.read_bytes() == before


async def test_expected_hash(api, nb_path):
    _, read = await api("GET", "notebooks", "work/sample.ipynb")
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={"action": "edit", "cell_index": 0, "content": "a", "expected_hash": read["hash"]},
    )
    assert status == 200
    before = nb_path.read_bytes()
    status, body = await api(
        "POST",
        "notebooks",
        "work/sample.ipynb",
        body={"action": "edit", "cell_index": 0, "content": "b", "expected_hash": read["hash"]},
    )
    assert status == 409
    assert "changed since it was read" in body["message"]
    assert nb_path.read_bytes() == before


ERROR_CASES = [
    (
        {"action": "edit", "cell_index": 5, "content": "x"},
        "Cell index 5 is out of range for edit (valid range: 0..4, notebook has 5 cells)",
    ),
    (
        {"action": "insert", "cell_index": 6, "content": "x"},
        "Cell index 6 is out of range for insert (valid range: 0..5, notebook has 5 cells)",
    ),
    (
        {"action": "delete", "cell_index": -1},
        "Cell index -1 is out of range for delete (valid range: 0..4, notebook has 5 cells)",
    ),
    (
        {"action": "move", "cell_index": 0, "to_index": 5},
        "to_index 5 is out of range for move (valid range: 0..4, notebook has 5 cells)",
    ),
    ({"action": "edit", "cell_index": 0}, "Content is required for edit action"),
    ({"action": "insert", "cell_index": 0}, "Content is required for insert action"),
    (
        {"action": "explode", "cell_index": 0},
        "unknown action 'explode' (expected one of: edit, insert, delete, move, clear_outputs, replace)",
    ),
    ({"cell_index": 0}, "'action' is required (one of: edit, insert, delete, move, clear_outputs, replace)"),
    ({"action": "edit", "cell_id": "nope", "content": "x"}, "Cell id 'nope' not found in notebook"),
    (
        {"action": "edit", "cell_index": "1", "content": "x"},
        "'cell_index' must be an integer, got str",
    ),
    (
        {"action": "edit", "cell_index": True, "content": "x"},
        "'cell_index' must be an integer, got bool",
    ),
    ({"action": "edit", "cell_index": 0, "content": 5}, "'content' must be a string, got int"),
    (
        {"action": "insert", "content": "x", "cell_type": "python"},
        "unknown cell_type 'python' (expected one of: code, markdown, raw)",
    ),
    (
        {"action": "edit", "cell_index": 0, "content": "x", "colour": "red"},
        "unknown field 'colour' (allowed: action, cell_index, cell_id, content, cell_type, expected_hash, "
        "upgrade, repair)",
    ),
    ({"action": "delete"}, "'cell_index' or 'cell_id' is required for delete action"),
    ({"action": "move", "cell_index": 0}, "'to_index' is required for move action"),
    (
        {"action": "edit", "cell_index": 0, "cell_id": "cell-2", "content": "x"},
        "'cell_index' 0 and 'cell_id' 'cell-2' name different cells (that id is at index 2); "
        "send one of them",
    ),
    ({"ops": []}, "'ops' must be a non-empty array of operations"),
    (
        {"ops": [{"action": "delete", "cell_index": 0}], "action": "edit"},
        "unknown field 'action' next to 'ops' (a batch takes only 'ops', 'expected_hash', 'upgrade' and "
        "'repair'; "
        "put operation fields inside each op)",
    ),
    ([1, 2], 'Request body must be a JSON object: one operation or {"ops": [...]}'),
    (
        {"action": "edit", "cell_index": 0, "content": "x", "expected_hash": 3},
        "'expected_hash' must be a string (the 'hash' of an earlier answer), got int",
    ),
]


@pytest.mark.parametrize(("request_body", "message"), ERROR_CASES)
async def test_bad_requests_answer_400_and_change_nothing(api, nb_path, request_body, message):
    before = nb_path.read_bytes()
    status, body = await api("POST", "notebooks", "work/sample.ipynb", body=request_body)
    assert status == 400
    assert body["message"] == message
    assert nb_path.read_bytes() == before


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"", "Request body is empty"),
        (b"{not json", "Request body is not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    ],
)
async def test_unparseable_bodies(api, nb_path, raw, fragment):
    before = nb_path.read_bytes()
    status, body = await api("POST", "notebooks", "work/sample.ipynb", raw=raw)
    assert status == 400
    assert fragment in body["message"]
    assert nb_path.read_bytes() == before


async def test_missing_notebook_is_404(api, jp_root_dir):
    for method, body in (("GET", None), ("POST", {"action": "delete", "cell_index": 0})):
        status, answer = await api(method, "notebooks", "nope/missing.ipynb", body=body)
        assert status == 404
        assert answer["message"] == "Notebook not found: nope/missing.ipynb"


@pytest.mark.parametrize(
    ("text", "age"), [('{"cells": [', 3600), ('{"cells": ]}', 0), ('{"cells": []} {"tail": 1}', 0)]
)
async def test_invalid_json_notebook(api, jp_root_dir, text, age):
    """400 at once for a file that cannot be a save in progress: broken in the middle, or cut off long ago
    (a cut-off file written a moment ago is a writer at work: see test_concurrent_writers.py)."""
    path = jp_root_dir / "broken.ipynb"
    path.write_text(text)
    os.utime(path, (time.time() - age, time.time() - age))
    for method, body in (("GET", None), ("POST", {"action": "delete", "cell_index": 0})):
        status, answer = await api(method, "notebooks", "broken.ipynb", body=body)
        assert status == 400
        assert answer["message"].startswith("Invalid JSON in notebook: broken.ipynb")
    assert path.read_text() == text


async def test_missing_cells_array(api, jp_root_dir):
    path = jp_root_dir / "nocells.ipynb"
    path.write_text('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}')
    status, answer = await api(
        "POST",
        "notebooks",
        "nocells.ipynb",
        body={"action": "insert", "cell_index": 0, "content": "x"},
    )
    assert status == 400
    assert answer["message"] == "Invalid notebook structure (missing cells array): nocells.ipynb"
    assert path.read_text() == '{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}'


async def test_invalid_notebook_is_never_written(api, jp_root_dir):
    path = jp_root_dir / "invalid.ipynb"
    text = json.dumps(
        {
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {},
            "cells": [{"cell_type": "code", "id": "a", "source": "x", "metadata": {}}],
        }
    )
    path.write_text(text)
    status, answer = await api(
        "POST",
        "notebooks",
        "invalid.ipynb",
        body={"action": "insert", "cell_index": 0, "content": "x"},
    )
    assert status == 400
    assert answer["message"].startswith(
        "Notebook invalid.ipynb was already invalid before this change (nothing was changed): "
        "cell 0: 'outputs' is a required property."
    )
    assert '"repair": true' in answer["message"]
    assert path.read_text() == text


async def test_not_a_notebook_path(api, jp_root_dir):
    (jp_root_dir / "notes.txt").write_text("hello")
    status, answer = await api("GET", "notebooks", "notes.txt")
    assert status == 400
    assert "Not a notebook" in answer["message"]


async def test_hidden_notebook_is_404(api, jp_root_dir):
    path = write_nb(jp_root_dir, ".secret/hidden.ipynb", sample_notebook())
    before = path.read_bytes()
    for method, body in (("GET", None), ("POST", {"action": "delete", "cell_index": 0})):
        status, _ = await api(method, "notebooks", ".secret/hidden.ipynb", body=body)
        assert status == 404
    assert path.read_bytes() == before


async def test_path_outside_root(api, jp_root_dir, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    target = write_nb(outside, "victim.ipynb", sample_notebook())
    before = target.read_bytes()
    rel = "../" * 10 + str(target).lstrip("/")
    for method, body in (("GET", None), ("POST", {"action": "delete", "cell_index": 0})):
        status, _ = await api(method, "notebooks", rel, body=body)
        assert status == 404
    assert target.read_bytes() == before


async def test_no_token_is_refused(jp_fetch, nb_path):
    from tornado.httpclient import HTTPClientError

    for method, body in (
        ("GET", None),
        ("POST", json.dumps({"action": "delete", "cell_index": 0})),
    ):
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch(
                "api",
                "agent",
                "notebooks",
                "work/sample.ipynb",
                method=method,
                body=body,
                headers={"Authorization": ""},
            )
        assert info.value.code == 403
    assert len(json.loads(nb_path.read_text())["cells"]) == 5


async def test_concurrent_inserts_all_land(api, nb_path):
    results = await asyncio.gather(
        *[
            api(
                "POST",
                "notebooks",
                "work/sample.ipynb",
                body={"action": "insert", "content": f"cell {i}"},
            )
            for i in range(50)
        ]
    )
    assert all(status == 200 for status, _ in results)
    cells = json.loads(nb_path.read_text())["cells"]
    assert len(cells) == 55
    assert sorted(join for c in cells[5:] for join in c["source"]) == sorted(f"cell {i}" for i in range(50))
    assert len({c["id"] for c in cells}) == 55


async def test_golden_bytes_only_edited_cell_changes(api, jp_root_dir):
    """A notebook written by nbformat, edited in one cell: only that cell's lines differ."""
    nb = sample_notebook()
    path = write_nb(jp_root_dir, "golden.ipynb", nb)
    original = path.read_text()
    status, _ = await api(
        "POST",
        "notebooks",
        "golden.ipynb",
        body={"action": "edit", "cell_id": "cell-3", "content": "1/1\n# fixed"},
    )
    assert status == 200
    nb.cells[3].source = "1/1\n# fixed"
    assert path.read_text() == nbformat.writes(nb) + "\n"
    old_lines, new_lines = original.splitlines(), path.read_text().splitlines()
    changed = [i for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=False)) if a != b]
    assert len(new_lines) == len(old_lines) + 1
    assert "1/0" in "".join(old_lines[changed[0] : changed[-1] + 1])
    assert old_lines[: changed[0]] == new_lines[: changed[0]]
    assert old_lines[-20:] == new_lines[-20:]


async def test_same_operation_same_bytes(api, jp_root_dir):
    outputs = []
    for name in ("a.ipynb", "b.ipynb"):
        path = write_nb(jp_root_dir, name, sample_notebook())
        status, _ = await api(
            "POST",
            "notebooks",
            name,
            body={
                "ops": [
                    {"action": "insert", "cell_index": 2, "content": "x = 1"},
                    {
                        "action": "insert",
                        "cell_index": 0,
                        "content": "# note",
                        "cell_type": "markdown",
                    },
                ]
            },
        )
        assert status == 200
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("minor", [0, 1, 2, 3, 4, 5])
async def test_nbformat_minors(api, jp_root_dir, minor):
    path = write_nb(jp_root_dir, f"minor{minor}.ipynb", sample_notebook(minor))
    status, body = await api(
        "POST",
        "notebooks",
        f"minor{minor}.ipynb",
        body={"action": "insert", "cell_index": 1, "content": "y = 2"},
    )
    assert status == 200, body
    nb = json.loads(path.read_text())
    assert nb["nbformat_minor"] == minor
    assert ("id" in nb["cells"][1]) == (minor >= 5)
    nbformat.validate(nb)
    if minor < 5:
        status, body = await api(
            "POST", "notebooks", f"minor{minor}.ipynb", body={"action": "delete", "cell_id": "abc"}
        )
        assert status == 400
        assert "has no cell ids" in body["message"]


async def test_unicode_sources(api, jp_root_dir):
    path = write_nb(jp_root_dir, "ünïcode/日本.ipynb", sample_notebook())
    content = "print('héllo wörld 🌍')\n# 日本語のコメント"
    status, body = await api(
        "POST",
        "notebooks",
        "ünïcode/日本.ipynb",
        body={"action": "edit", "cell_index": 1, "content": content},
    )
    assert status == 200, body
    text = path.read_text(encoding="utf-8")
    assert "🌍" in text and "日本語" in text
    status, body = await api("GET", "notebooks", "ünïcode/日本.ipynb")
    assert body["cells"][1]["source"] == content


async def test_edit_creates_checkpoint_of_original(api, jp_serverapp, nb_path):
    before = nb_path.read_text()
    status, _ = await api(
        "POST", "notebooks", "work/sample.ipynb", body={"action": "delete", "cell_index": 0}
    )
    assert status == 200
    cm = jp_serverapp.contents_manager
    checkpoints = await cm.list_checkpoints("work/sample.ipynb")
    assert len(checkpoints) == 1
    await cm.restore_checkpoint(checkpoints[0]["id"], "work/sample.ipynb")
    assert json.loads(nb_path.read_text()) == json.loads(before)


async def test_edit_runs_the_save_hooks_of_the_contents_manager(api, jp_serverapp, nb_path):
    """The atomic write keeps what contents_manager.save does around its write: both hooks, in order; a
    pre-save hook may change the text (the answer's hash is that of the bytes saved) or refuse the save."""
    calls: list[tuple[str, str]] = []

    def pre_save(model, path, contents_manager, **kwargs):
        calls.append(("pre", path))
        if "refuse" in model["content"]:
            raise web.HTTPError(403, "Refused by a pre-save hook")
        model["content"] = model["content"].replace("secret", "[redacted]")

    def post_save(model, os_path, contents_manager, **kwargs):
        calls.append(("post", os.path.relpath(os_path, contents_manager.root_dir)))

    cm = jp_serverapp.contents_manager
    cm.register_pre_save_hook(pre_save)
    cm.register_post_save_hook(post_save)
    status, answer = await api(
        "POST", "notebooks", "work/sample.ipynb", body={"action": "insert", "content": "secret"}
    )
    assert status == 200, answer
    assert calls == [("pre", "work/sample.ipynb"), ("post", os.path.join("work", "sample.ipynb"))]
    assert json.loads(nb_path.read_text())["cells"][-1]["source"] == ["[redacted]"]
    assert answer["hash"] == sha(nb_path)
    before = nb_path.read_bytes()
    status, answer = await api(
        "POST", "notebooks", "work/sample.ipynb", body={"action": "insert", "content": "refuse"}
    )
    assert status == 403 and answer["message"] == "Refused by a pre-save hook"
    assert nb_path.read_bytes() == before
    assert sorted(p.name for p in nb_path.parent.iterdir()) == [".ipynb_checkpoints", "sample.ipynb"]


async def test_edit_keeps_the_files_permission_bits_and_writes_through_a_link(api, jp_root_dir, nb_path):
    os.chmod(nb_path, 0o640)
    os.symlink("sample.ipynb", nb_path.parent / "link.ipynb")
    status, answer = await api(
        "POST", "notebooks", "work/link.ipynb", body={"action": "insert", "content": "x"}
    )
    assert status == 200, answer
    assert (nb_path.parent / "link.ipynb").is_symlink()
    assert json.loads(nb_path.read_text())["cells"][-1]["source"] == ["x"]
    assert nb_path.stat().st_mode & 0o777 == 0o640


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="not applicable here: root may write a read-only file",
)
async def test_edit_of_a_read_only_file_is_403(api, nb_path):
    os.chmod(nb_path, 0o444)
    before = nb_path.read_bytes()
    status, answer = await api(
        "POST", "notebooks", "work/sample.ipynb", body={"action": "insert", "content": "x"}
    )
    assert status == 403 and answer["message"] == "Permission denied: work/sample.ipynb"
    assert nb_path.read_bytes() == before
