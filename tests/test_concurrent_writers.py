"""The agent routes next to other writers of the same notebook: JupyterLab saving through ``/api/contents``
in the same server, and another process rewriting the file.

jupyter_server's save writes the file in place (after copying it to ``.~<name>``) in a worker thread, so
the event loop serves other requests while the file is half written; its notebook read "recovers" such a
file by moving it to ``<name>.invalid`` and restoring the copy. These tests hold a save half done at a known
point (a patched ``nbformat.write``) and check that an agent read waits (503 past
``NotebookStore.busy_timeout``) instead of recovering, then let both sides write concurrently and check
that no acknowledged write is lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

pytestmark = pytest.mark.timeout(120)
BUSY_TIMEOUT = 0.5


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "NotebookStore": {"busy_timeout": BUSY_TIMEOUT},
    }


def notebook(padding: int = 0) -> nbformat.NotebookNode:
    """A small notebook; ``padding`` characters of output make each save take longer."""
    outputs = [new_output("stream", name="stdout", text="x" * padding)] if padding else []
    nb = new_notebook(
        cells=[new_markdown_cell("# t", id="m"), new_code_cell("x = 1", id="c", outputs=outputs)]
    )
    nb.nbformat_minor = 5
    return nb


def sources(path: Path) -> list[str]:
    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    nbformat.validate(nb)
    return [cell.source for cell in nb.cells]


def strays(root: Path) -> list[str]:
    """Files a broken save or a recovery leaves behind: ``*.invalid`` and our temporary files."""
    return sorted(p.name for p in root.iterdir() if p.name.endswith((".invalid", ".tmp")))


class Gate:
    """Makes the next ``nbformat.write`` of the contents manager stop half way until released."""

    def __init__(self) -> None:
        self.armed = False
        self.half_written = threading.Event()
        self.release = threading.Event()

    async def wait_half_written(self) -> None:
        deadline = time.monotonic() + 30
        while not self.half_written.is_set():
            assert time.monotonic() < deadline, "the contents API save never started writing"
            await asyncio.sleep(0.005)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    gate = Gate()
    real_write = nbformat.write

    def write(nb: Any, fp: Any, version: Any = nbformat.NO_CONVERT, **kwargs: Any) -> None:
        if not hasattr(fp, "write"):  # a file name: not the contents manager
            return real_write(nb, fp, version, **kwargs)
        text = nbformat.writes(nb, version=version, **kwargs)
        if not text.endswith("\n"):
            text += "\n"
        if not gate.armed:
            fp.write(text)
            return None
        gate.armed = False
        fp.write(text[: len(text) // 2])
        fp.flush()
        gate.half_written.set()  # runs in the contents manager's worker thread: the server goes on
        gate.release.wait(30)
        fp.write(text[len(text) // 2 :])
        return None

    monkeypatch.setattr(nbformat, "write", write)
    return gate


def contents_model(nb: dict[str, Any]) -> str:
    return json.dumps({"type": "notebook", "format": "json", "content": nb})


async def agent(jp_fetch, method: str, body: Any = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    kwargs: dict[str, Any] = {"method": method, "raise_error": False, "request_timeout": 60}
    if body is not None:
        kwargs["body"] = json.dumps(body)
    response = await jp_fetch("api", "agent", "notebooks", "nb.ipynb", **kwargs)
    return response.code, json.loads(response.body), dict(response.headers)


async def test_agent_waits_for_a_contents_api_save_and_never_recovers_it(jp_fetch, jp_root_dir, gate) -> None:
    path = jp_root_dir / "nb.ipynb"
    nbformat.write(notebook(20_000), str(path))
    lab = notebook(20_000)
    lab.cells.append(new_code_cell("lab = 1", id="lab"))

    gate.armed = True
    save = asyncio.ensure_future(
        jp_fetch("api", "contents", "nb.ipynb", method="PUT", body=contents_model(lab), raise_error=False)
    )
    await gate.wait_half_written()
    try:
        status, answer, headers = await agent(jp_fetch, "GET")
        assert status == 503, answer
        assert "being saved by another writer" in answer["message"]
        assert headers.get("Retry-After") == "1"
        status, answer, headers = await agent(jp_fetch, "POST", {"action": "insert", "content": "agent = 1"})
        assert status == 503, answer
        assert headers.get("Retry-After") == "1"
        # nothing was moved aside or restored under the writer
        assert path.exists() and (jp_root_dir / ".~nb.ipynb").exists()
        assert strays(jp_root_dir) == []
    finally:
        gate.release.set()
    assert (await save).code == 200

    status, answer, _ = await agent(jp_fetch, "GET")
    assert status == 200 and [c["source"] for c in answer["cells"]] == ["# t", "x = 1", "lab = 1"]
    status, answer, _ = await agent(jp_fetch, "POST", {"action": "insert", "content": "agent = 1"})
    assert status == 200, answer
    assert sources(path) == ["# t", "x = 1", "lab = 1", "agent = 1"]
    assert strays(jp_root_dir) == [] and not (jp_root_dir / ".~nb.ipynb").exists()


class Watcher(threading.Thread):
    """Looks at the directory as fast as it can: the notebook must never be missing, never set aside."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path = path
        self.stop = threading.Event()
        self.problems: list[str] = []
        self.looks = 0

    def run(self) -> None:
        while not self.stop.is_set() and len(self.problems) < 10:
            self.looks += 1
            if not self.path.exists():
                self.problems.append(f"{self.path.name} missing")
            if (self.path.parent / (self.path.name + ".invalid")).exists():
                self.problems.append(f"{self.path.name}.invalid appeared")
            time.sleep(0.0005)


ROUNDS = 30


async def test_agent_and_contents_api_writing_at_once_lose_no_acknowledged_write(
    jp_fetch, jp_root_dir
) -> None:
    """Both sides read-modify-write the same notebook for ROUNDS rounds each, at the same time.

    Every acknowledged write is in the final file, unless a contents API write that overlapped it and was
    based on a read from before it replaced it (that PUT sends a whole notebook without it: that is the
    contents API's last-writer-wins, not a loss). The file never vanishes and nothing is set aside.
    """
    path = jp_root_dir / "nb.ipynb"
    nbformat.write(notebook(300_000), str(path))
    agent_writes: list[tuple[str, float, float]] = []  # marker, start, acknowledged
    lab_writes: list[tuple[str, float, float, set[str]]] = []  # marker, read at, acknowledged, sources
    refusals: list[tuple[int, str]] = []
    watcher = Watcher(path)
    watcher.start()

    async def agent_side() -> None:
        for i in range(ROUNDS):
            start = time.monotonic()
            status, answer, _ = await agent(jp_fetch, "POST", {"action": "insert", "content": f"agent-{i}"})
            if status == 200:
                agent_writes.append((f"agent-{i}", start, time.monotonic()))
            else:
                refusals.append((status, answer["message"]))
            status, answer, _ = await agent(jp_fetch, "GET")
            if status != 200:
                refusals.append((status, answer["message"]))

    async def lab_side() -> None:
        for j in range(ROUNDS):
            read_at = time.monotonic()
            response = await jp_fetch("api", "contents", "nb.ipynb", params={"type": "notebook"})
            nb = json.loads(response.body)["content"]
            nb["cells"].append(new_code_cell(f"lab-{j}", id=f"lab-{j}"))
            response = await jp_fetch("api", "contents", "nb.ipynb", method="PUT", body=contents_model(nb))
            assert response.code == 200
            lab_writes.append((f"lab-{j}", read_at, time.monotonic(), {c["source"] for c in nb["cells"]}))

    try:
        await asyncio.gather(agent_side(), lab_side())
    finally:
        watcher.stop.set()
        watcher.join()
    assert watcher.problems == [] and watcher.looks > 100
    # Reads always succeed. An edit may be refused when the other side rewrote the file during each of its
    # attempts (this test's contents API side rewrites it back to back), never acknowledged and lost.
    assert all(status == 409 and "kept changing" in message for status, message in refusals), refusals
    assert len(agent_writes) >= ROUNDS // 2
    final = set(sources(path))
    assert [marker for marker, *_ in lab_writes if marker not in final] == []
    lost = [
        marker
        for marker, start, acked in agent_writes
        if marker not in final
        and not any(
            marker not in put and read_at < acked and put_acked > start
            for _, read_at, put_acked, put in lab_writes
        )
    ]
    assert lost == []
    assert strays(jp_root_dir) == []


def external_writer(path: Path, count: int, interval: float, overwritten: list[Any], torn: list[int]) -> None:
    """Replace the notebook ``count`` times (write a temporary file, rename it over), ``interval`` apart.

    Each write carries its number in ``metadata.ext``; an agent edit keeps it. Before each write the
    writer looks at the file: if it no longer carries the previous number, an agent edit based on an older
    version replaced an acknowledged write of ours; if it does not parse, it caught a save half done.
    """
    for k in range(1, count + 1):
        try:
            seen = json.loads(path.read_bytes())["metadata"].get("ext", 0)
        except ValueError:
            torn.append(k)
        else:
            if seen != k - 1:
                overwritten.append((k - 1, seen))
        nb = notebook()
        nb.metadata["ext"] = k
        tmp = path.with_name(f".ext-{k}.tmp")
        tmp.write_text(nbformat.writes(nb))
        os.replace(tmp, path)
        time.sleep(interval)


@pytest.mark.parametrize("with_hash", [True, False], ids=["expected_hash", "no_hash"])
async def test_external_writes_are_never_overwritten_without_a_409(jp_fetch, jp_root_dir, with_hash) -> None:
    """Another process replaces the file every 20 ms (100 times) while an agent reads and edits it.

    With expected_hash a change after the read is a 409; without, the edit is applied to the new content.
    Either way no acknowledged external write is overwritten.
    """
    path = jp_root_dir / "nb.ipynb"
    nbformat.write(notebook(), str(path))
    overwritten: list[tuple[int, Any]] = []
    torn: list[int] = []
    writer = threading.Thread(target=external_writer, args=(path, 100, 0.02, overwritten, torn), daemon=True)
    writer.start()
    counts: dict[int, int] = {}
    i = 0
    while writer.is_alive():
        status, read, _ = await agent(jp_fetch, "GET")
        assert status == 200, read
        body: dict[str, Any] = {"action": "insert", "content": f"agent-{i}"}
        if with_hash:
            body["expected_hash"] = read["hash"]
        status, _, _ = await agent(jp_fetch, "POST", body)
        counts[status] = counts.get(status, 0) + 1
        i += 1
    writer.join()
    assert overwritten == [] and torn == []
    assert json.loads(path.read_bytes())["metadata"]["ext"] == 100
    assert set(counts) <= {200, 409} and counts.get(200, 0) > 10, counts
    if not with_hash:
        assert counts.get(409, 0) <= counts[200] // 10, counts  # re-applied, not refused
