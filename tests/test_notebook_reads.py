"""Reading a notebook for a model, against a real Jupyter server: paging, cell_ids, include, format=text,
and one output in full (or one MIME type of it as bytes)."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from samples import PNG, PNG_BYTES, sample_notebook, write_nb

from jupyter_agent_tools.errors import BadRequest, NotFound
from jupyter_agent_tools.notebook import store as store_module
from jupyter_agent_tools.notebook.reading import (
    cell_ref,
    find_cell,
    id_counts,
    read_notebook,
    read_view,
    render_text,
)
from jupyter_agent_tools.testing.notebooks import large_notebook

SVG = '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
HTML = "<script>alert(document.cookie)</script><b>bold</b>"


@pytest.fixture
def nb_path(jp_root_dir: Path) -> Path:
    return write_nb(jp_root_dir, "work/sample.ipynb", sample_notebook(unicode=True))


@pytest.fixture
def fetch(jp_fetch):
    """GET an agent route: (status, headers, body bytes); never raises on HTTP errors."""

    async def call(*parts: str, params: dict[str, Any] | None = None, headers: dict[str, str] | None = None):
        kwargs: dict[str, Any] = {"method": "GET", "raise_error": False}
        if params:
            kwargs["params"] = params
        if headers is not None:
            kwargs["headers"] = headers
        response = await jp_fetch("api", "agent", *parts, **kwargs)
        return response.code, response.headers, response.body

    return call


def _rich_notebook() -> Any:
    """Every output kind the output route serves, with text longer than the summary limit."""
    long = "".join(f"line {i}\n" for i in range(3000))
    cells = [
        new_markdown_cell("# Title", id="md"),
        new_code_cell(
            "run()",
            id="rich",
            execution_count=7,
            outputs=[
                new_output("stream", name="stdout", text=["\x1b[31mred\x1b[0m ", long]),
                new_output(
                    "display_data",
                    data={"image/png": PNG, "image/svg+xml": SVG, "text/plain": "<Figure>"},
                ),
                new_output(
                    "execute_result",
                    execution_count=7,
                    data={"text/html": HTML, "text/plain": "df", "application/json": {"a": [1, 2]}},
                ),
                new_output(
                    "error",
                    ename="ValueError",
                    evalue="bad",
                    traceback=["\x1b[0;31mValueError\x1b[0m: bad", "  at line 1"],
                ),
            ],
        ),
    ]
    nb = new_notebook(cells=cells)
    nb.nbformat_minor = 5
    return nb


# -------------------------------------------------------------------------------------------------- paging


async def test_every_answer_has_the_cell_count_and_the_range(api, nb_path):
    status, whole = await api("GET", "notebooks", "work/sample.ipynb")
    assert status == 200
    assert (whole["cell_count"], whole["start"], whole["next_start"]) == (5, 0, None)
    status, page = await api("GET", "notebooks", "work/sample.ipynb", params={"start": "1", "limit": "2"})
    assert status == 200
    assert [c["index"] for c in page["cells"]] == [1, 2]
    assert (page["cell_count"], page["start"], page["next_start"]) == (5, 1, 3)
    assert page["cells"] == whole["cells"][1:3]
    status, last = await api("GET", "notebooks", "work/sample.ipynb", params={"start": "3", "limit": "10"})
    assert [c["index"] for c in last["cells"]] == [3, 4] and last["next_start"] is None
    assert last["hash"] == whole["hash"]


async def test_a_start_past_the_end_is_an_empty_page_with_the_count(api, nb_path):
    status, page = await api("GET", "notebooks", "work/sample.ipynb", params={"start": "99"})
    assert status == 200
    assert (page["cells"], page["cell_count"], page["start"], page["next_start"]) == ([], 5, 99, None)


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"start": "-1"}, "'start' must be an integer from 0"),
        ({"start": "x"}, "'start' must be an integer"),
        ({"start": "1e3"}, "'start' must be an integer"),
        ({"limit": "0"}, "'limit' must be an integer from 1 to 10000"),
        ({"limit": "10001"}, "'limit' must be an integer from 1 to 10000"),
        ({"limit": "99999999999999999999"}, "'limit' must be an integer"),
        ({"cell_ids": "cell-1", "start": "1"}, "either 'cell_ids' or 'start'/'limit'"),
        ({"cell_ids": " , "}, "'cell_ids' names no cell"),
        ({"include": "tags,secrets"}, "Unknown 'include' value 'secrets'"),
        ({"format": "yaml"}, "'format' must be one of json, text"),
    ],
)
async def test_bad_read_parameters_are_400_naming_them(api, nb_path, params, fragment):
    status, body = await api("GET", "notebooks", "work/sample.ipynb", params=params)
    assert status == 400, body
    assert fragment in body["message"]


async def test_pages_of_a_large_notebook_with_images_add_up_to_the_whole(api, jp_root_dir):
    write_nb(jp_root_dir, "big.ipynb", large_notebook(400))
    status, whole = await api("GET", "notebooks", "big.ipynb")
    assert status == 200 and whole["cell_count"] == 400
    cells, start = [], 0
    while start is not None:
        status, page = await api(
            "GET", "notebooks", "big.ipynb", params={"start": str(start), "limit": "150"}
        )
        assert status == 200 and page["cell_count"] == 400 and len(page["cells"]) <= 150
        cells += page["cells"]
        start = page["next_start"]
    assert cells == whole["cells"]


# ------------------------------------------------------------------------------------------------ cell_ids


async def test_cell_ids_return_the_named_cells_in_the_order_asked(api, nb_path):
    params = {"cell_ids": "cell-3,@0, cell-1"}
    status, body = await api("GET", "notebooks", "work/sample.ipynb", params=params)
    assert status == 200
    assert [c["index"] for c in body["cells"]] == [3, 0, 1]
    assert (body["cell_count"], body["start"], body["next_start"]) == (5, None, None)


async def test_an_unknown_cell_id_is_404_naming_it(api, nb_path):
    status, body = await api("GET", "notebooks", "work/sample.ipynb", params={"cell_ids": "cell-1,nope"})
    assert status == 404 and "'nope'" in body["message"]
    status, body = await api("GET", "notebooks", "work/sample.ipynb", params={"cell_ids": "@5"})
    assert status == 404 and "5 cells (@0 to @4)" in body["message"]


async def test_a_duplicate_cell_id_is_ambiguous_and_says_how_to_address_one(api, jp_root_dir):
    nb = sample_notebook()
    nb.cells[3]["id"] = "cell-1"
    path = jp_root_dir / "dup.ipynb"
    path.write_text(json.dumps(nb, indent=1))  # nbformat.write would repair the duplicate
    before = path.read_bytes()
    status, body = await api("GET", "notebooks", "dup.ipynb", params={"cell_ids": "cell-1"})
    assert status == 400
    assert "shared by 2 cells (@1, @3)" in body["message"] and "@index" in body["message"]
    status, body = await api("GET", "notebooks", "dup.ipynb", params={"cell_ids": "@3"})
    assert status == 200 and body["cells"][0]["index"] == 3
    status, body = await api("GET", "notebooks", "dup.ipynb", "cells", "cell-1", "outputs", "0")
    assert status == 400 and "shared by 2 cells" in body["message"]
    status, body = await api("GET", "notebooks", "dup.ipynb", "cells", "@3", "outputs", "0")
    assert status == 200 and body["output"]["ename"] == "ZeroDivisionError"
    assert path.read_bytes() == before


# ------------------------------------------------------------------------------------------------- include


async def test_include_tags_metadata_and_attachment_names(api, jp_root_dir):
    nb = sample_notebook(unicode=True)
    nb.cells[1].metadata.update({"tags": ["setup", 3], "scrolled": True, "trusted": True})
    write_nb(jp_root_dir, "meta.ipynb", nb)
    status, plain = await api("GET", "notebooks", "meta.ipynb")
    assert status == 200
    assert all("tags" not in c and "metadata" not in c and "attachments" not in c for c in plain["cells"])
    params = {"include": "tags,metadata,attachments"}
    status, body = await api("GET", "notebooks", "meta.ipynb", params=params)
    assert status == 200
    cells = body["cells"]
    assert cells[1]["tags"] == ["setup"] and cells[0]["tags"] == []
    assert cells[1]["metadata"] == {"tags": ["setup", 3], "scrolled": True}  # never 'trusted'
    assert cells[0]["attachments"] == [{"name": "x.png", "mime": "image/png", "bytes": len(PNG_BYTES)}]
    assert "attachments" not in cells[1]  # code cells have none
    assert PNG not in json.dumps(body)
    params["include_binary"] = "1"
    status, body = await api("GET", "notebooks", "meta.ipynb", params=params)
    assert body["cells"][0]["attachments"][0]["data"] == PNG


# ---------------------------------------------------------------------------------------------- as text


async def test_text_format_carries_every_cell_header_and_source(fetch, api, nb_path):
    status, headers, raw = await fetch("notebooks", "work/sample.ipynb", params={"format": "text"})
    assert status == 200
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    text = raw.decode()
    _, body = await api("GET", "notebooks", "work/sample.ipynb")
    assert text.startswith(f"# work/sample.ipynb nbformat 4.5 hash {body['hash']}\n# cells 0-4 of 5\n")
    for cell in body["cells"]:
        header = f"### [{cell['index']}] {cell['cell_type']} id={cell['id']}"
        if cell["execution_count"] is not None:
            header += f" exec={cell['execution_count']}"
        assert f"{header}\n{cell['source']}" in text
    assert "-> out[0] stream stdout\n3.141592653589793\nπ ≈ 3.14\n" in text
    assert "-> out[0] display_data\n<Figure size 640x480>\n[image/png 1.0 KB]\n" in text
    assert "-> out[0] error ZeroDivisionError: division by zero\nZeroDivisionError: division by zero" in text
    assert PNG not in text


async def test_text_format_pages_and_names_the_next_page(fetch, nb_path):
    status, _, raw = await fetch("notebooks", "work/sample.ipynb", params={"format": "text", "limit": "2"})
    assert status == 200
    text = raw.decode()
    assert "# cells 0-1 of 5; next page: start=2\n" in text
    assert "### [1] code" in text and "### [2]" not in text
    params = {"format": "text", "cell_ids": "cell-4", "include": "tags"}
    status, _, raw = await fetch("notebooks", "work/sample.ipynb", params=params)
    assert (
        "# 1 of 5 cells by id\n" in raw.decode() and "### [4] raw id=cell-4\nraw text\nline 2" in raw.decode()
    )


async def test_text_is_much_smaller_than_json_for_a_large_notebook(fetch, jp_root_dir):
    path = write_nb(jp_root_dir, "big.ipynb", large_notebook(300))
    status, _, text = await fetch("notebooks", "big.ipynb", params={"format": "text"})
    assert status == 200
    status, _, answer = await fetch("notebooks", "big.ipynb")
    assert status == 200
    raw = path.read_bytes()
    assert len(text) < 0.8 * len(answer), (len(text), len(answer))
    assert len(answer) < 0.1 * len(raw), (len(answer), len(raw))
    body = json.loads(answer)
    decoded = text.decode()
    for cell in body["cells"]:  # nothing of what the JSON says about a cell is missing from the text
        assert f"### [{cell['index']}] {cell['cell_type']} id={cell['id']}" in decoded
        assert cell["source"] in decoded


async def test_a_large_notebook_is_summarized_off_the_event_loop(api, jp_root_dir, monkeypatch):
    write_nb(jp_root_dir, "big.ipynb", large_notebook(250))  # about 2.5 MB: over OFF_LOOP_CHARS
    small = write_nb(jp_root_dir, "small.ipynb", sample_notebook())
    assert small.stat().st_size < store_module.OFF_LOOP_CHARS
    threads: list[str] = []
    real = store_module.read_notebook

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args)

    monkeypatch.setattr(store_module, "read_notebook", spy)
    assert (await api("GET", "notebooks", "big.ipynb"))[0] == 200
    assert (await api("GET", "notebooks", "small.ipynb"))[0] == 200
    main = threading.main_thread().name
    assert threads[0] != main and threads[1] == main


# ------------------------------------------------------------------------------------------- one output


async def test_summaries_point_at_the_output_route_and_following_them_works(api, fetch, jp_root_dir):
    write_nb(jp_root_dir, "work/rich nb.ipynb", _rich_notebook())
    status, body = await api("GET", "notebooks", "work/rich nb.ipynb")
    assert status == 200
    stream, display, result, error = body["cells"][1]["outputs"]
    base = "/api/agent/notebooks/work/rich%20nb.ipynb/cells/rich/outputs"
    assert result["data"][0]["url"] == f"{base}/2?mime=application/json"
    assert stream["full"] == f"{base}/0?mime=text/plain"
    assert stream["text"].endswith("more characters]")
    assert display["data"] == [
        {"mime": "image/png", "bytes": len(PNG_BYTES), "url": f"{base}/1?mime=image/png"},
        {"mime": "image/svg+xml", "bytes": len(SVG), "url": f"{base}/1?mime=image/svg%2Bxml"},
    ]
    assert "full" not in error and "full" not in display
    # Follow the hints as a client would (the same server, its base_url).
    url = stream["full"].removeprefix("/api/agent/")
    route, _, query = url.partition("?")
    status, headers, raw = await fetch(*unquote(route).split("/"), params={"mime": "text/plain"})
    assert query == "mime=text/plain"
    assert status == 200
    assert raw.decode() == "red " + "".join(f"line {i}\n" for i in range(3000))  # whole, ANSI removed
    route, _, _ = display["data"][0]["url"].removeprefix("/api/agent/").partition("?")
    status, headers, raw = await fetch(*unquote(route).split("/"), params={"mime": "image/png"})
    assert status == 200 and raw == PNG_BYTES and headers["Content-Type"] == "image/png"


async def test_one_output_in_full_as_json(api, jp_root_dir):
    write_nb(jp_root_dir, "rich.ipynb", _rich_notebook())
    for cell in ("rich", "@1"):
        status, body = await api("GET", "notebooks", "rich.ipynb", "cells", cell, "outputs", "0")
        assert status == 200, body
        assert (body["cell_index"], body["cell_id"], body["output_index"]) == (1, "rich", 0)
        assert body["mimes"] == ["text/plain"]
        assert body["output"]["text"].startswith("\x1b[31mred\x1b[0m line 0\n")  # as stored, joined
        assert body["output"]["text"].endswith("line 2999\n")
    status, body = await api("GET", "notebooks", "rich.ipynb", "cells", "rich", "outputs", "2")
    assert body["mimes"] == ["application/json", "text/html", "text/plain"]
    assert body["output"]["data"]["application/json"] == {"a": [1, 2]}
    assert body["output"]["data"]["text/html"] == HTML
    status, whole = await api("GET", "notebooks", "rich.ipynb")
    assert body["hash"] == whole["hash"]


async def test_one_mime_type_as_its_own_content_type(fetch, jp_root_dir):
    write_nb(jp_root_dir, "rich.ipynb", _rich_notebook())
    route = ("notebooks", "rich.ipynb", "cells", "rich", "outputs")
    status, headers, raw = await fetch(*route, "2", params={"mime": "application/json"})
    assert (status, headers["Content-Type"], json.loads(raw)) == (200, "application/json", {"a": [1, 2]})
    status, headers, raw = await fetch(*route, "2", params={"mime": "text/plain"})
    assert (status, headers["Content-Type"], raw) == (200, "text/plain; charset=utf-8", b"df")
    status, headers, raw = await fetch(*route, "3", params={"mime": "text/plain"})
    assert (status, raw.decode()) == (200, "ValueError: bad\n  at line 1")
    assert "attachment" not in headers.get("Content-Disposition", "")


@pytest.mark.parametrize(("n", "mime", "data"), [("1", "image/svg+xml", SVG), ("2", "text/html", HTML)])
async def test_active_content_is_sandboxed_never_sniffed_and_an_attachment(fetch, jp_root_dir, n, mime, data):
    write_nb(jp_root_dir, "rich.ipynb", _rich_notebook())
    status, headers, raw = await fetch(
        "notebooks", "rich.ipynb", "cells", "rich", "outputs", n, params={"mime": mime}
    )
    assert status == 200 and raw.decode() == data
    assert headers["Content-Type"] == f"{mime}; charset=utf-8"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Content-Disposition"].startswith("attachment;")
    csp = [part.strip() for part in headers["Content-Security-Policy"].split(";")]
    assert "sandbox" in csp and "default-src 'none'" in csp


@pytest.mark.parametrize(
    ("cell", "n", "params", "status", "fragment"),
    [
        (
            "rich",
            "1",
            {"mime": "text/html"},
            404,
            "has no text/html (MIME types: image/png, image/svg+xml, text",
        ),
        ("rich", "1", {"mime": "text/html\r\nX-Evil: 1"}, 400, "'mime' must be a MIME type"),
        ("rich", "1", {"mime": "image"}, 400, "'mime' must be a MIME type"),
        ("rich", "4", {}, 404, "has outputs 0 to 3; there is no output 4"),
        ("rich", "-1", {}, 400, "output index must be an integer from 0"),
        ("rich", "one", {}, 400, "must be an integer"),
        ("md", "0", {}, 404, "is a markdown cell: it has no outputs"),
        ("@2", "0", {}, 404, "No cell @2: the notebook has 2 cells"),
        ("nope", "0", {}, 404, "No cell with id 'nope'"),
    ],
)
async def test_output_route_errors_say_what_to_fix(api, jp_root_dir, cell, n, params, status, fragment):
    path = write_nb(jp_root_dir, "rich.ipynb", _rich_notebook())
    before = path.read_bytes()
    got, body = await api("GET", "notebooks", "rich.ipynb", "cells", cell, "outputs", n, params=params)
    assert got == status, body
    assert fragment in body["message"], body
    assert path.read_bytes() == before


async def test_broken_base64_is_400_not_500(fetch, jp_root_dir):
    nb = _rich_notebook()
    nb.cells[1].outputs[1]["data"]["image/png"] = "not base64!!"
    write_nb(jp_root_dir, "broken.ipynb", nb)
    status, _, raw = await fetch(
        "notebooks", "broken.ipynb", "cells", "rich", "outputs", "1", params={"mime": "image/png"}
    )
    assert status == 400 and "not valid base64" in json.loads(raw)["message"]


async def test_output_route_respects_paths_hidden_files_and_auth(fetch, jp_root_dir):
    write_nb(jp_root_dir, ".secret/rich.ipynb", _rich_notebook())
    write_nb(jp_root_dir, "rich.ipynb", _rich_notebook())
    status, _, _ = await fetch("notebooks", ".secret", "rich.ipynb", "cells", "rich", "outputs", "0")
    assert status == 404
    status, _, _ = await fetch("notebooks", "missing.ipynb", "cells", "rich", "outputs", "0")
    assert status == 404
    status, _, _ = await fetch(
        "notebooks", "rich.ipynb", "cells", "rich", "outputs", "0", headers={"Authorization": ""}
    )
    assert status == 403


async def test_cells_without_ids_are_addressed_by_index(api, jp_root_dir):
    write_nb(jp_root_dir, "old.ipynb", sample_notebook(minor=4))
    status, body = await api("GET", "notebooks", "old.ipynb")
    assert status == 200
    url = body["cells"][2]["outputs"][0]["data"][0]["url"]
    assert url == "/api/agent/notebooks/old.ipynb/cells/@2/outputs/0?mime=image/png"
    status, output = await api("GET", "notebooks", "old.ipynb", "cells", "@2", "outputs", "0")
    assert status == 200 and output["cell_id"] is None and output["output"]["data"]["image/png"] == PNG
    assert base64.b64decode(output["output"]["data"]["image/png"]) == PNG_BYTES


# ------------------------------------------------------------------------------------------- pure core


def test_text_rendering_is_deterministic_and_escapes_nothing():
    nb = json.loads(json.dumps(large_notebook(60)))
    first = render_text(read_notebook(nb, "d/a b.ipynb", "h", 100, read_view()))
    again = render_text(read_notebook(json.loads(json.dumps(nb)), "d/a b.ipynb", "h", 100, read_view()))
    assert first == again
    assert "\\n" not in first and '"execution_count"' not in first and "null" not in first
    assert "GET /api/agent/notebooks/d/a%20b.ipynb/cells/<id or @index>/outputs/<n>" in first


def test_cells_are_addressed_by_unique_id_else_by_index():
    cells = [{"id": "a"}, {"id": "b"}, {"id": "b"}, {}, {"id": "x,y"}]
    counts = id_counts(cells)
    assert [cell_ref(cells, i, counts) for i in range(5)] == ["a", "@1", "@2", "@3", "@4"]
    assert find_cell(cells, "a") == 0 and find_cell(cells, "@3") == 3
    with pytest.raises(BadRequest, match=r"shared by 2 cells \(@1, @2\)"):
        find_cell(cells, "b")
    with pytest.raises(NotFound, match="No cell @5"):
        find_cell(cells, "@5")


def test_read_view_takes_lists_too_and_checks_them():
    view = read_view(cell_ids=["a", " @2 "], include=["tags"])
    assert view.cell_refs == ("a", "@2") and view.include == frozenset({"tags"})
    with pytest.raises(BadRequest, match="at most 1000"):
        read_view(cell_ids=[f"c{i}" for i in range(1001)])
    with pytest.raises(BadRequest, match="'start' must be an integer from 0"):
        read_view(start=10**10)


def test_text_header_says_what_a_read_knows_about_the_file():
    answer = read_notebook({"nbformat": 4, "nbformat_minor": 5, "cells": []}, "a.ipynb", "h", 10, read_view())
    plain = render_text(answer)
    answer.update(converted_from="3.0", problems=["cell 1: duplicate id 'x'", "no nbformat_minor"])
    text = render_text(answer)
    assert text.startswith(plain.rstrip("\n"))
    assert "# this file is nbformat 3.0, shown converted: an edit must send upgrade: true" in text
    assert (
        "# invalid as found (an edit must send repair: true): cell 1: duplicate id 'x'; no nbformat_minor"
        in text
    )
