"""Nothing lost under faults and load.

SIGKILL a real server subprocess in the middle of a stream of notebook edits, over and over: the notebook
holds every acknowledged edit, plus at most the one in flight, and is valid. What jupyter_server calls an
atomic save is "copy the file to .~<name>, write the file in place, remove the copy": a kill inside the
write leaves a truncated file and the copy, which the contents manager restores on its next notebook read.
The tests below pin down both cases, and the bounded load test (benchmarks/bench_load.py) checks that
concurrent agents lose no edit, no eval answer and no session state, and leak no descriptor or kernel.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import jupyter_server

pytestmark = pytest.mark.timeout(240)


def big_notebook(megabytes: float = 4.0) -> nbformat.NotebookNode:
    """A notebook of a few MB, so that each save takes long enough to be killed in the middle of."""
    png = base64.b64encode(random.Random(0).randbytes(int(megabytes * 750_000))).decode()
    cells = [
        new_code_cell("plot()", id="big", outputs=[new_output("display_data", data={"image/png": png})]),
        new_code_cell("base = 1", id="base"),
    ]
    nb = new_notebook(cells=cells)
    nb.nbformat_minor = 5
    return nb


def stream_edits(server, acked: list[str], inflight: list[str], stop: threading.Event, start: int) -> None:
    """Insert cells one after another until the server dies; record what was acknowledged."""
    with server.client(timeout=30) as client:
        i = start
        while not stop.is_set():
            source = f"edit = {i}"
            inflight.append(source)
            try:
                status, _ = client.request(
                    "POST", "api/agent/notebooks/crash.ipynb", {"action": "insert", "content": source}
                )
            except Exception:  # the server died under this request: its fate is unknown
                return
            if status != 200:
                return
            acked.append(source)
            inflight.remove(source)
            i += 1


def sources_of(text: str) -> list[str] | None:
    try:
        nb = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
        nbformat.validate(nb)
    except Exception:
        return None
    return [cell.source for cell in nb.cells]


MAX_ROUNDS = 12


@pytest.fixture(scope="module")
def crashes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Kill servers mid-stream until one kill lands inside the write of a save (a cut file and its copy).

    Every kill that did not land inside a save is checked on the spot: the file is valid and holds every
    acknowledged edit, plus at most the one in flight. Returns the state right after the kill that did.
    """
    root = tmp_path_factory.mktemp("crash") / "root"
    root.mkdir()
    path, backup = root / "crash.ipynb", root / ".~crash.ipynb"
    nbformat.write(big_notebook(), str(path))
    expected: list[str] = ["plot()", "base = 1"]
    rng = random.Random(os.getpid())
    problems: list[str] = []
    for round_ in range(MAX_ROUNDS):
        with jupyter_server(root) as server:
            acked: list[str] = []
            inflight: list[str] = []
            stop = threading.Event()
            worker = threading.Thread(
                target=stream_edits, args=(server, acked, inflight, stop, 1000 * round_), daemon=True
            )
            worker.start()
            deadline = time.monotonic() + 60
            while len(acked) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            if round_ % 2:  # at a random moment of the stream
                time.sleep(rng.uniform(0.0, 0.3))
            else:  # as soon as a save has copied the file aside, i.e. while it writes it in place
                while not backup.exists() and time.monotonic() < deadline:
                    pass
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)
            stop.set()
            worker.join(timeout=30)
        if len(acked) < 2:
            problems.append(f"round {round_}: the server acknowledged {len(acked)} edits")
            break
        before, after = expected + acked, expected + acked + inflight[:1]
        sources = sources_of(path.read_text())
        if sources is None and backup.exists():  # killed inside the write of the edit in flight
            saved = tmp_path_factory.mktemp("crashed") / "root"
            shutil.copytree(root, saved, symlinks=True)
            return {
                "root": saved,
                "before": before,
                "after": after,
                "rounds": round_ + 1,
                "problems": problems,
            }
        if sources not in (before, after):
            problems.append(f"round {round_}: notebook is {sources and sources[-3:]}, acked {acked[-2:]}")
            break
        expected = sources
    return {"root": None, "rounds": MAX_ROUNDS, "problems": problems}


def test_kills_outside_a_save_leave_a_valid_notebook_with_every_acknowledged_edit(crashes) -> None:
    assert crashes["problems"] == []


def test_kill_inside_a_save_is_recovered_by_the_contents_manager(crashes, tmp_path: Path) -> None:
    """The contents manager's "atomic" save writes in place after copying the file to ``.~<name>``; a kill
    mid-write leaves that copy, and its next notebook read restores it: the state before the edit in
    flight, with every acknowledged edit."""
    if crashes["root"] is None:
        pytest.skip(f"no kill landed inside a save in {crashes['rounds']} rounds")
    root = tmp_path / "root"
    shutil.copytree(crashes["root"], root, symlinks=True)
    assert sources_of((root / "crash.ipynb").read_text()) is None  # the kill did cut the write
    assert sources_of((root / ".~crash.ipynb").read_text()) == crashes["before"]
    with jupyter_server(root) as server, server.client() as client:
        model = client.json("GET", "api/contents/crash.ipynb?type=notebook&content=1")
        assert [c["source"] for c in model["content"]["cells"]] == crashes["before"]
        read = client.json("GET", "api/agent/notebooks/crash.ipynb")
        assert [c["source"] for c in read["cells"]] == crashes["before"]
        client.json("POST", "api/agent/notebooks/crash.ipynb", {"action": "insert", "content": "after"})
    assert sources_of((root / "crash.ipynb").read_text()) == [*crashes["before"], "after"]


def test_kill_inside_a_save_is_recovered_by_our_routes_too(crashes, tmp_path: Path) -> None:
    if crashes["root"] is None:
        pytest.skip(f"no kill landed inside a save in {crashes['rounds']} rounds")
    root = tmp_path / "root"
    shutil.copytree(crashes["root"], root, symlinks=True)
    with jupyter_server(root) as server, server.client() as client:
        status, body = client.request("GET", "api/agent/notebooks/crash.ipynb")
        assert status == 200, body[:300]
        assert [c["source"] for c in json.loads(body)["cells"]] == crashes["before"]


def test_reads_never_see_a_half_written_notebook(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    nbformat.write(big_notebook(3.0), str(root / "crash.ipynb"))
    torn: list[str] = []
    with jupyter_server(root) as server:
        stop = threading.Event()
        acked: list[str] = []
        writer = threading.Thread(target=stream_edits, args=(server, acked, [], stop, 0), daemon=True)
        writer.start()
        deadline = time.monotonic() + 20
        with server.client() as client:
            while time.monotonic() < deadline and not torn:
                status, body = client.request("GET", "api/agent/notebooks/crash.ipynb")
                if status != 200:
                    torn.append(body[:200].decode(errors="replace"))
        stop.set()
        writer.join(timeout=30)
    assert len(acked) > 0
    assert torn == []


@pytest.mark.load
@pytest.mark.timeout(300)
def test_load_loses_nothing_and_leaks_nothing() -> None:
    """About 20 s of six concurrent agents (benchmarks/bench_load.py; ``python -m benchmarks load``: 60 s)."""
    from benchmarks.bench_load import run_load

    report = run_load(duration=float(os.environ.get("LOAD_SECONDS", "20")), agents=6, sessions=3)
    assert report.problems == []
    assert (
        report.counts["edit"] > 0 and report.counts["eval (json)"] > 0 and report.counts["eval (stream)"] > 0
    )
    assert report.kernels_after == report.kernels_before == 3
