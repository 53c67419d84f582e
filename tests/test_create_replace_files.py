"""Creating notebooks, replacing text inside a cell, and finding files (issue 29, items 1, 2 and 7), through
HTTP, the official MCP SDK client and the CLI, against one real server subprocess with real kernels.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from test_cli import run_cli

from jupyter_agent_tools.client import AgentAPIError, AgentClient
from jupyter_agent_tools.testing.server import Server, jupyter_server

pytestmark = pytest.mark.timeout(240)
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("create-root")
    (root / "proj" / "deep" / "deeper").mkdir(parents=True)
    (root / ".hidden").mkdir()
    for name in ("proj/a.ipynb", "proj/deep/b.ipynb", "proj/deep/deeper/c.ipynb", ".hidden/h.ipynb"):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
        nbformat.write(nb, str(root / name))
    (root / "proj" / "notes.txt").write_text("hello")
    outside = tmp_path_factory.mktemp("outside-root")
    (root / "out").symlink_to(outside, target_is_directory=True)
    (root / "media dir").mkdir()
    outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="hi\n"),
        nbformat.v4.new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}),
    ]
    cell = nbformat.v4.new_code_cell("show()", id="fig", execution_count=1, outputs=outputs)
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), str(root / "media dir" / "img é.ipynb"))
    (root / "proj" / ".secret.ipynb").write_text("{}")
    with jupyter_server(root_dir=root) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[AgentClient]:
    with AgentClient(server.url, server.token) as c:
        yield c


def error_of(call: Any) -> AgentAPIError:
    with pytest.raises(AgentAPIError) as info:
        call()
    return info.value


def raw(server: Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    with server.client() as c:
        status, content = c.request(method, path, body)
    return status, json.loads(content) if content else None


# ----------------------------------------------------------------------------------------- create


def test_create_writes_nbformat_4_5_in_nbformats_layout_with_the_kernelspec(server, client) -> None:
    cells = [{"cell_type": "markdown", "source": "# Title"}, {"source": "x = 20 + 1\nx"}]
    status, answer = raw(server, "POST", "api/agent/notebooks/made/new.ipynb", None)
    assert status == 400  # no body: the message says what to send
    status, answer = raw(
        server, "POST", "api/agent/notebooks/made/new.ipynb", {"action": "create", "cells": cells}
    )
    assert status == 404 and "parents" in answer["message"], answer  # the folder does not exist
    status, answer = raw(
        server,
        "POST",
        "api/agent/notebooks/made/new.ipynb",
        {"action": "create", "cells": cells, "parents": True},
    )
    assert status == 201, answer
    assert answer["path"] == "made/new.ipynb" and answer["cell_count"] == 2
    assert [c["source"] for c in answer["cells"]] == ["# Title", "x = 20 + 1\nx"]
    assert answer["change_id"] and answer["recorded"] is True and "Created" in answer["message"]
    text = (server.root_dir / "made" / "new.ipynb").read_text()
    nb = nbformat.reads(text, as_version=4)
    nbformat.validate(nb)
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5)
    assert nbformat.writes(nb) + ("" if nbformat.writes(nb).endswith("\n") else "\n") == text
    spec = nb.metadata.kernelspec
    assert spec.name == "python3" and spec.language == "python" and spec.display_name
    assert [c.cell_type for c in nb.cells] == ["markdown", "code"] and all(c.id for c in nb.cells)
    assert answer["hash"] == __import__("hashlib").sha256(text.encode()).hexdigest()
    # the same path again: 409, the file untouched
    status, again = raw(server, "POST", "api/agent/notebooks/made/new.ipynb", {"action": "create"})
    assert status == 409 and "already exists" in again["message"], again
    assert (server.root_dir / "made" / "new.ipynb").read_text() == text
    # the ledger has it, as a create that cannot be undone
    changes = client.notebook_changes("made/new.ipynb")["changes"]
    assert changes[0]["kind"] == "create" and changes[0]["id"] == answer["change_id"]
    undo = error_of(lambda: client.undo_change("made/new.ipynb", answer["change_id"]))
    assert undo.status == 400 and "delete the file" in str(undo)
    # and it runs in a real kernel of that kernelspec
    with server.client() as c:
        ran = c.json("POST", "api/agent/notebooks/made/new.ipynb/run", {"all": True})
    assert "21" in ran["output"], ran


def test_create_refuses_what_it_must(server, client) -> None:
    cases = [
        ("bad.txt", {"action": "create"}, 400, "Not a notebook"),
        ("x.ipynb", {"action": "create", "kernel_name": "nope"}, 400, "No such kernel: 'nope'"),
        ("x.ipynb", {"action": "create", "cells": [{"cell_type": "code"}]}, 400, "source"),
        ("x.ipynb", {"action": "create", "colour": 1}, 400, "colour"),
        (".hidden/new.ipynb", {"action": "create"}, 404, "not found"),
        ("proj/.new.ipynb", {"action": "create"}, 404, "not found"),
        ("proj/a.ipynb", {"action": "create"}, 409, "already exists"),
        ("proj", {"action": "create"}, 400, "Not a notebook"),
        ("proj/notes.txt/x.ipynb", {"action": "create", "parents": True}, 404, "not found"),
    ]
    for path, body, status, message in cases:
        got, answer = raw(server, "POST", f"api/agent/notebooks/{path}", body)
        assert got == status and message.lower() in answer["message"].lower(), (path, got, answer)
    got, answer = raw(
        server, "POST", "api/agent/notebooks/proj/%2E%2E/%2E%2E/out.ipynb", {"action": "create"}
    )
    assert got in (400, 404), answer
    assert not (server.root_dir.parent / "out.ipynb").exists() and not (server.root_dir / "x.ipynb").exists()
    assert not (server.root_dir / "proj" / ".new.ipynb").exists()
    # a folder that links outside the root: refused before anything is made there
    outside = (server.root_dir / "out").resolve()
    for path, body in (
        ("out/x.ipynb", {"action": "create"}),
        ("out/n/x.ipynb", {"action": "create", "parents": True}),
    ):
        got, answer = raw(server, "POST", f"api/agent/notebooks/{path}", body)
        assert got == 403 and "outside the server root" in answer["message"], answer
    assert list(outside.iterdir()) == []


def test_create_then_edit_and_client_method(client, server) -> None:
    made = client.create_notebook("made2/one.ipynb", [{"source": "a = 1"}], parents=True)
    assert made["cells"][0]["source"] == "a = 1"
    edited = client.edit_notebook(
        "made2/one.ipynb", {"action": "insert", "content": "b = 2"}, expected_hash=made["hash"]
    )
    assert edited["details"]["totalCells"] == 2


# ---------------------------------------------------------------------------------------- replace


def _notebook(server: Server, name: str) -> str:
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("x = 1\ny = x + 1\nprint(x, y)", id="c1"),
            nbformat.v4.new_markdown_cell("# A title\ntext", id="m1"),
        ]
    )
    nbformat.write(nb, str(server.root_dir / name))
    return name


def test_replace_once_everywhere_and_refusals(server, client) -> None:
    path = _notebook(server, "rep.ipynb")
    before = (server.root_dir / path).read_bytes()
    several = error_of(lambda: client.replace_in_cell(path, "c1", "x", "z"))
    assert several.status == 400 and "matches 3 times" in str(several) and "line 1" in str(several)
    status, body = raw(
        server,
        "POST",
        f"api/agent/notebooks/{path}",
        {"action": "replace", "cell_id": "c1", "old": "x", "new": "z"},
    )
    assert status == 400 and body["matches"] == [
        {"line": 1, "text": "x = 1"},
        {"line": 2, "text": "y = x + 1"},
        {"line": 3, "text": "print(x, y)"},
    ], body
    none = error_of(lambda: client.replace_in_cell(path, 1, "missing", "z"))
    assert none.status == 400 and "No match" in str(none)
    assert (server.root_dir / path).read_bytes() == before  # nothing written by a refusal
    once = client.replace_in_cell(path, "c1", "y = x + 1", "y = x + 2")
    assert (
        once["details"]["replacements"] == 1 and once["details"]["cellSource"].splitlines()[1] == "y = x + 2"
    )
    every = client.replace_in_cell(path, 0, "x", "w", all=True, expected_hash=once["hash"])
    assert every["details"]["replacements"] == 3
    cells = nbformat.read(str(server.root_dir / path), as_version=4).cells
    assert cells[0].source == "w = 1\ny = w + 2\nprint(w, y)"
    # in a batch, all or none: a failing replace leaves the edit before it unapplied
    status, body = raw(
        server,
        "POST",
        f"api/agent/notebooks/{path}",
        {
            "ops": [
                {"action": "edit", "cell_id": "m1", "content": "changed"},
                {"action": "replace", "cell_id": "m1", "old": "nope", "new": ""},
            ]
        },
    )
    assert status == 400 and body["message"].startswith("ops[1]: No match") and "matches" in body, body
    assert nbformat.read(str(server.root_dir / path), as_version=4).cells[1].source == "# A title\ntext"
    batch = client.edit_notebook(
        path,
        [
            {"action": "replace", "cell_id": "m1", "old": "A title", "new": "The title"},
            {"action": "replace", "cell_index": 0, "old": "print(w, y)", "new": "print(y)"},
        ],
    )
    assert [r["details"]["replacements"] for r in batch["results"]] == [1, 1]
    changes = client.notebook_changes(path)["changes"]
    assert changes[0]["kind"] == "edit" and changes[0]["id"] == batch["change_id"]


# ------------------------------------------------------------------------------------------ files


def test_files_glob_depth_paging_and_hidden(server, client) -> None:
    everything = client.list_files(glob="**/*.ipynb")
    paths = [e["path"] for e in everything["entries"]]
    assert "proj/a.ipynb" in paths and "proj/deep/deeper/c.ipynb" in paths
    assert not any(p.startswith(".hidden") or ".secret" in p for p in paths)
    assert paths == sorted(paths, key=lambda p: p.split("/"))
    entry = next(e for e in everything["entries"] if e["path"] == "proj/a.ipynb")
    assert entry["type"] == "notebook" and entry["size"] == (server.root_dir / "proj/a.ipynb").stat().st_size
    assert entry["last_modified"].startswith("20")
    assert everything["truncated"] is False and everything["next_start"] is None
    shallow = client.list_files("proj", glob="**/*.ipynb", max_depth=2)
    assert [e["path"] for e in shallow["entries"]] == ["proj/a.ipynb", "proj/deep/b.ipynb"]
    own = client.list_files("proj")
    assert {e["path"] for e in own["entries"]} == {"proj/a.ipynb", "proj/deep", "proj/notes.txt"}
    # pages of 1 give the same entries as one page
    pages, start = [], None
    for _ in range(20):
        page = client.list_files(glob="**/*.ipynb", limit=1, start=start)
        pages += [e["path"] for e in page["entries"]]
        start = page["next_start"]
        if start is None:
            break
    assert pages == paths
    for query, message in [
        ("glob=a/../b", "'..'"),
        ("max_depth=0", "max_depth"),
        ("limit=0", "limit"),
        ("path=proj/notes.txt", "Not a directory"),
        ("path=../x", "'.' or '..'"),
    ]:
        status, body = raw(server, "GET", f"api/agent/files?{query}")
        assert status == 400 and message in body["message"], (query, body)
    status, body = raw(server, "GET", "api/agent/files?path=.hidden")
    assert status == 404, body
    status, body = raw(server, "GET", "api/agent/files?path=missing")
    assert status == 404, body


# -------------------------------------------------------------------------------------------- MCP


async def _mcp(server: Server, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    url = server.url + "api/agent/mcp"
    async with (
        create_mcp_http_client(headers={"Authorization": f"token {server.token}"}) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        return [await session.call_tool(name, arguments) for name, arguments in calls]


def test_mcp_create_replace_and_file_list(server) -> None:
    _notebook(server, "mcp-rep.ipynb")
    created, again, replaced, refused, listed, paged = asyncio.run(
        _mcp(
            server,
            [
                ("notebook_edit", {"path": "m/new.ipynb", "action": "create", "parents": True,
                                   "cells": [{"source": "1 + 1"}]}),
                ("notebook_edit", {"path": "m/new.ipynb", "action": "create"}),
                ("notebook_edit", {"path": "mcp-rep.ipynb", "action": "replace", "cell_id": "c1",
                                   "old": "print(x, y)", "new": "print(y)"}),
                ("notebook_edit", {"path": "mcp-rep.ipynb", "action": "replace", "cell_id": "c1",
                                   "old": "x", "new": "q"}),
                ("file_list", {"glob": "m/*.ipynb"}),
                ("file_list", {"path": "proj", "recursive": True, "limit": 2}),
            ],
        )
    )  # fmt: skip
    assert not created.is_error and "Created m/new.ipynb" in created.content[0].text, created
    assert created.structured_content["cells"][0]["source"] == "1 + 1"
    assert again.is_error and "already exists" in again.content[0].text
    assert not replaced.is_error and replaced.structured_content["details"]["replacements"] == 1
    assert (
        refused.is_error
        and "matches 2 times" in refused.content[0].text
        and "line 2" in refused.content[0].text
    )
    assert [e["path"] for e in listed.structured_content["entries"]] == ["m/new.ipynb"]
    assert paged.structured_content["truncated"] and paged.structured_content["next_start"] == "proj/deep"
    assert "start='proj/deep'" in paged.content[0].text


# ------------------------------------------------------------------------------------ MCP resources


async def _resources(server: Server) -> dict[str, Any]:
    url = server.url + "api/agent/mcp"
    async with (
        create_mcp_http_client(headers={"Authorization": f"token {server.token}"}) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        listed = await session.list_resources()
        templates = await session.list_resource_templates()
        uri = next(r.uri for r in listed.resources if str(r.name) == "media dir/img é.ipynb")
        notebook = await session.read_resource(uri)
        output = await session.read_resource(f"{uri}/cells/fig/outputs/1")
        stream = await session.read_resource(f"{uri}/cells/@0/outputs/0")
        missing = []
        for bad in (
            f"{uri}/cells/fig/outputs/9",
            "jupyter://notebooks/.hidden/h.ipynb",
            "file:///etc/passwd",
        ):
            try:
                await session.read_resource(bad)
            except Exception as e:  # the SDK raises McpError with the JSON-RPC error
                missing.append(e)
        return {
            "init": init,
            "listed": listed,
            "templates": templates,
            "notebook": notebook,
            "output": output,
            "stream": stream,
            "missing": missing,
        }


def test_mcp_resources_list_read_and_templates(server) -> None:
    got = asyncio.run(_resources(server))
    assert got["init"].capabilities.resources is not None
    names = [str(r.name) for r in got["listed"].resources]
    assert "proj/a.ipynb" in names and not any(".hidden" in n or ".secret" in n for n in names)
    first = next(r for r in got["listed"].resources if str(r.name) == "proj/a.ipynb")
    assert str(first.uri) == "jupyter://notebooks/proj/a.ipynb" and first.mime_type == "text/plain"
    assert first.size == (server.root_dir / "proj" / "a.ipynb").stat().st_size
    templates = {str(t.uri_template) for t in got["templates"].resource_templates}
    assert "jupyter://notebooks/{+path}/cells/{cell}/outputs/{n}" in templates
    text = got["notebook"].contents[0]
    assert text.mime_type == "text/plain" and "show()" in text.text and "img é.ipynb" in text.text
    by_mime = {c.mime_type: c for c in got["output"].contents}
    assert by_mime["image/png"].blob == PNG and by_mime["text/plain"].text == "<Figure>"
    assert got["stream"].contents[0].text == "hi\n"
    assert len(got["missing"]) == 3
    for error in got["missing"]:
        assert getattr(error, "error", None) is not None and error.error.code == -32002, error


# -------------------------------------------------------------------------------------------- CLI


def cli(server: Server, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``jupyter agent ARGS`` against ``server`` (test_cli.run_cli: the environment without the caller's
    server settings, the server's own runtime dir)."""
    assert server.runtime_dir is not None
    return run_cli(*args, server=server, runtime=server.runtime_dir, input=input)


def test_cli_nb_create_nb_replace_and_files(server) -> None:
    made = cli(server, "nb", "create", "c/cli.ipynb", "--parents", "--markdown", "# T", "--code", "v = 1\nv")
    assert made.returncode == 0, made.stderr
    assert "Created c/cli.ipynb" in made.stderr and "v = 1" in made.stdout
    cells = nbformat.read(str(server.root_dir / "c" / "cli.ipynb"), as_version=4).cells
    assert [c.cell_type for c in cells] == ["markdown", "code"]
    exists = cli(server, "nb", "create", "c/cli.ipynb")
    assert exists.returncode != 0 and "already exists" in exists.stderr
    replaced = cli(server, "nb", "replace", "c/cli.ipynb", "--cell", "1", "--old", "v", "--new", "w", "--all")
    assert replaced.returncode == 0, replaced.stderr
    assert nbformat.read(str(server.root_dir / "c" / "cli.ipynb"), as_version=4).cells[1].source == "w = 1\nw"
    several = cli(server, "nb", "replace", "c/cli.ipynb", "--cell", "1", "--old", "w", "--new", "v")
    assert several.returncode != 0 and "matches 2 times" in several.stderr
    files = cli(server, "files", "--glob", "**/*.ipynb", "--limit", "2")
    assert files.returncode == 0, files.stderr
    assert files.stdout.splitlines()[0].startswith("c/cli.ipynb\t") and "(more: --start" in files.stdout
    as_json = cli(server, "files", "proj", "--json")
    assert {e["path"] for e in json.loads(as_json.stdout)["entries"]} >= {"proj/a.ipynb", "proj/deep"}


def test_cli_nb_replace_reads_multi_line_text_from_a_file_or_stdin(server, tmp_path) -> None:
    source = "def f(x):\n    return x\n\nprint(f(1))"
    made = cli(server, "nb", "create", "c/multi.ipynb", "--parents", "--code", source)
    assert made.returncode == 0, made.stderr
    old = tmp_path / "old.txt"
    old.write_text("def f(x):\n    return x\n")
    replace = ("nb", "replace", "c/multi.ipynb", "--cell", "0")
    replaced = cli(
        server, *replace, "--old-file", str(old), "--new-file", "-", input="def f(x):\n    return 2 * x\n"
    )
    assert replaced.returncode == 0, replaced.stderr
    cells = nbformat.read(str(server.root_dir / "c" / "multi.ipynb"), as_version=4).cells
    assert cells[0].source == "def f(x):\n    return 2 * x\n\nprint(f(1))"
    twice = cli(server, *replace, "--old-file", "-", "--new-file", "-")
    assert twice.returncode == 2 and "stdin" in twice.stderr
    both = cli(server, *replace, "--old", "x", "--old-file", str(old), "--new", "y")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    missing = cli(server, *replace, "--old-file", str(tmp_path / "no"), "--new", "y")
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_a_listing_examines_a_bounded_number_of_entries_and_resumes(tmp_path, monkeypatch) -> None:
    """No server: the walk stops after MAX_SCANNED entries with next_start, and pages resume without
    losing or repeating an entry, through jupyter_server's own file contents manager (listed in threads)."""
    from jupyter_server.services.contents.filemanager import FileContentsManager

    from jupyter_agent_tools import files

    for d in range(6):
        (tmp_path / f"d{d}").mkdir()
        for f in range(30):
            (tmp_path / f"d{d}" / f"n{f:02}.ipynb").write_text("{}")
            (tmp_path / f"d{d}" / f"t{f:02}.txt").write_text("x")
    monkeypatch.setattr(files, "MAX_SCANNED", 50)
    cm = FileContentsManager(root_dir=str(tmp_path))

    async def walk() -> tuple[list[str], int]:
        seen: list[str] = []
        start, calls = None, 0
        while True:
            calls += 1
            page = await files.list_files(cm, "", glob="**/*.ipynb", limit=1000, start=start)
            assert len(page["entries"]) <= 50
            seen += [e["path"] for e in page["entries"]]
            start = page["next_start"]
            if start is None:
                return seen, calls

    seen, calls = asyncio.run(walk())
    expected = [f"d{d}/n{f:02}.ipynb" for d in range(6) for f in range(30)]
    assert seen == expected  # every notebook once, in order, although each call stopped after 50 entries
    assert calls >= (6 * 61) // 50  # 366 entries examined (6 folders, 360 files), 50 per call


def test_a_symlink_loop_is_walked_once(tmp_path) -> None:
    """No server: a folder symlinked to its ancestor (or outside the root) is listed, not walked into."""
    from jupyter_server.services.contents.filemanager import FileContentsManager

    from jupyter_agent_tools import files

    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "a" / "b").mkdir(parents=True)
    outside.mkdir()
    (root / "a" / "b" / "n.ipynb").write_text("{}")
    (outside / "secret.ipynb").write_text("{}")
    os.symlink(root / "a", root / "a" / "b" / "loop")
    os.symlink(outside, root / "a" / "out")
    (root / "c").symlink_to(root / "a" / "b")  # a second way to b: walked, since it is not a loop
    cm = FileContentsManager(root_dir=str(root))
    page = asyncio.run(files.list_files(cm, "", recursive=True))
    paths = [e["path"] for e in page["entries"]]
    assert paths == [
        "a",
        "a/b",
        "a/b/loop",
        "a/b/n.ipynb",
        "a/out",
        "c",
        "c/loop",
        "c/loop/b",
        "c/loop/out",
        "c/n.ipynb",
    ], paths
    assert not page["truncated"]


def test_hidden_files_are_listed_only_where_the_contents_manager_allows_them(tmp_path) -> None:
    from jupyter_server.services.contents.filemanager import FileContentsManager

    from jupyter_agent_tools.files import list_files

    (tmp_path / ".hid").mkdir()
    (tmp_path / ".hid" / "h.ipynb").write_text("{}")
    (tmp_path / "v.ipynb").write_text("{}")

    async def paths(allow_hidden: bool) -> list[str]:
        cm = FileContentsManager(root_dir=str(tmp_path), allow_hidden=allow_hidden)
        page = await list_files(cm, "", glob="**/*.ipynb")
        return [e["path"] for e in page["entries"]]

    assert asyncio.run(paths(False)) == ["v.ipynb"]
    assert asyncio.run(paths(True)) == [".hid/h.ipynb", "v.ipynb"]
