"""Nothing lost under faults and load.

SIGKILL a real server subprocess in the middle of a stream of notebook edits, over and over: the notebook
holds every acknowledged edit, plus at most the one in flight, and is valid. The store writes a temporary
file and renames it over the notebook, so a kill anywhere leaves the old file or the new one. What
jupyter_server calls an atomic save (the contents API's) is "copy the file to .~<name>, write the file in
place, remove the copy": a kill inside that write leaves a truncated file and the copy, which its next
notebook read restores. Kills inside a save are not left to chance: a ``jupyter_server_config.py`` makes
the server stop half way through the write of the notebook and say so through a file, then the test kills
it. The bounded load test (benchmarks/load.py) checks that concurrent agents lose no
edit, no eval answer and no session state, and leak no descriptor or kernel.
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from benchmarks.load import run_load
from jupyter_agent_tools.notebook.disk import SAVE_IN_PROGRESS_SECONDS
from jupyter_agent_tools.testing.server import jupyter_server

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


ROUNDS = 4


def test_kills_during_a_stream_of_edits_leave_a_valid_notebook_with_every_acknowledged_edit(
    tmp_path: Path,
) -> None:
    """Kill at random moments, and as soon as a save has begun (the first file it creates next to it)."""
    root = tmp_path / "root"
    root.mkdir()
    path = root / "crash.ipynb"
    nbformat.write(big_notebook(), str(path))
    expected: list[str] = ["plot()", "base = 1"]
    rng = random.Random(os.getpid())
    for round_ in range(ROUNDS):
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
            if round_ % 2:
                time.sleep(rng.uniform(0.0, 0.3))
            else:
                before = set(os.listdir(root))
                while set(os.listdir(root)) <= before and time.monotonic() < deadline:
                    pass
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)
            stop.set()
            worker.join(timeout=30)
        assert len(acked) >= 2, f"round {round_}: the server acknowledged {len(acked)} edits"
        before_kill, after_kill = expected + acked, expected + acked + inflight[:1]
        sources = sources_of(path.read_text())
        assert sources in (before_kill, after_kill), (round_, sources and sources[-3:], acked[-2:])
        expected = sources


# Loaded by a server subprocess with --config: once the file ``PAUSE_ARM`` exists, the next write of a file
# named like the notebook in the root (the notebook itself, or a temporary file next to it; not jupyter's
# .~ copy) writes half its data to disk, creates the file ``PAUSE_SIGNAL`` and hangs until killed.
PAUSE_CONFIG = """
import builtins, os, time

_open = builtins.open
_root, _name = os.environ["PAUSE_ROOT"], os.environ["PAUSE_NAME"]
_arm, _signal = os.environ["PAUSE_ARM"], os.environ["PAUSE_SIGNAL"]


class _HalfWriter:
    def __init__(self, f):
        self._f = f

    def write(self, data):
        self._f.write(data[: len(data) // 2])
        self._f.flush()
        os.fsync(self._f.fileno())
        _open(_signal, "w").close()
        time.sleep(3600)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


def _pausing_open(file, mode="r", *args, **kwargs):
    f = _open(file, mode, *args, **kwargs)
    if isinstance(file, str) and set(mode) & set("wxa") and os.path.exists(_arm):
        directory, name = os.path.split(os.path.realpath(file))
        if directory == _root and _name in name and name != ".~" + _name:
            os.unlink(_arm)
            return _HalfWriter(f)
    return f


builtins.open = _pausing_open
"""


@contextlib.contextmanager
def server_pausing_in_saves(
    root: Path, tmp: Path, name: str = "crash.ipynb"
) -> Iterator[tuple[Any, Path, Path]]:
    """A server whose next save of ``name`` stops half way once armed: yields (server, arm, signal)."""
    config, arm, signal_file = tmp / "pause_config.py", tmp / "arm", tmp / "signal"
    config.write_text(PAUSE_CONFIG)
    env = {"PAUSE_ROOT": os.path.realpath(root), "PAUSE_NAME": name, "PAUSE_ARM": str(arm)}
    env["PAUSE_SIGNAL"] = str(signal_file)
    with jupyter_server(root, extra_args=[f"--config={config}"], env=env) as server:
        yield server, arm, signal_file


def kill_inside_a_save(server: Any, arm: Path, signal_file: Path, method: str, url: str, body: Any) -> None:
    """Send a request that saves, wait until its write is half done, SIGKILL the server."""
    arm.touch()
    client = server.client(timeout=120)
    request = threading.Thread(target=lambda: _ignore_errors(client.request, method, url, body), daemon=True)
    request.start()
    deadline = time.monotonic() + 60
    while not signal_file.exists():
        assert time.monotonic() < deadline and request.is_alive(), "the save never reached its write"
        time.sleep(0.01)
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=10)
    request.join(timeout=30)
    signal_file.unlink()


def _ignore_errors(call: Any, *args: Any) -> None:
    with contextlib.suppress(Exception):  # the server dies under the request
        call(*args)


def small_notebook(*sources: str) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_code_cell(source, id=f"c{i}") for i, source in enumerate(sources)])
    nb.nbformat_minor = 5
    return nb


@pytest.mark.parametrize("size", ["small", "big"])
def test_kill_inside_our_save_leaves_the_previous_notebook_complete(tmp_path: Path, size: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    path = root / "crash.ipynb"
    nb = big_notebook(1.0) if size == "big" else small_notebook("a = 1", "b = 2")
    nbformat.write(nb, str(path))
    before = sources_of(path.read_text())
    with server_pausing_in_saves(root, tmp_path) as (server, arm, signal_file):
        with server.client() as client:  # a first edit: its checkpoint and save are not interrupted
            client.json("POST", "api/agent/notebooks/crash.ipynb", {"action": "insert", "content": "first"})
        before = [*before, "first"]
        insert = {"action": "insert", "content": "lost"}
        kill_inside_a_save(server, arm, signal_file, "POST", "api/agent/notebooks/crash.ipynb", insert)
    assert path.stat().st_size > 0
    assert sources_of(path.read_text()) == before  # the raw file: complete, as before the edit in flight
    assert not (root / ".~crash.ipynb").exists()
    (leftover,) = root.glob(".~crash.ipynb.*.tmp")  # the half-written temporary file
    old = time.time() - SAVE_IN_PROGRESS_SECONDS - 1
    os.utime(leftover, (old, old))
    with jupyter_server(root) as server, server.client() as client:
        read = client.json("GET", "api/agent/notebooks/crash.ipynb")
        assert [c["source"] for c in read["cells"]] == before
        client.json("POST", "api/agent/notebooks/crash.ipynb", {"action": "insert", "content": "after"})
    assert sources_of(path.read_text()) == [*before, "after"]
    assert list(root.glob(".~*")) == []  # the next save removed the leftover


def test_kill_inside_a_contents_api_save_is_restored_once_the_save_is_over(tmp_path: Path) -> None:
    """The contents API's save killed mid-write leaves a cut file and jupyter's .~ copy. Right after, our
    read cannot tell it from a save still running: 503, and nothing is moved. Once the file has not changed
    for SAVE_IN_PROGRESS_SECONDS (here: its time set back), our read restores the copy, as jupyter's does."""
    root = tmp_path / "root"
    root.mkdir()
    path, copy = root / "crash.ipynb", root / ".~crash.ipynb"
    nbformat.write(small_notebook("a = 1", "b = 2"), str(path))
    lab = small_notebook("a = 1", "b = 2", "lab")
    model = {"type": "notebook", "format": "json", "content": lab}
    with server_pausing_in_saves(root, tmp_path) as (server, arm, signal_file):
        kill_inside_a_save(server, arm, signal_file, "PUT", "api/contents/crash.ipynb", model)
    assert sources_of(path.read_text()) is None  # the kill did cut the write
    assert sources_of(copy.read_text()) == ["a = 1", "b = 2"]
    busy = ["--NotebookStore.busy_timeout=0.2"]
    with jupyter_server(root, extra_args=busy) as server, server.client() as client:
        os.utime(path)  # as if the kill had just happened (the server may take long to start)
        status, body = client.request("GET", "api/agent/notebooks/crash.ipynb")
        assert status == 503, body[:300]
        assert b"being saved by another writer" in body
        assert copy.exists() and not (root / "crash.ipynb.invalid").exists()
        old = time.time() - SAVE_IN_PROGRESS_SECONDS - 1
        os.utime(path, (old, old))
        read = client.json("GET", "api/agent/notebooks/crash.ipynb")
        assert [c["source"] for c in read["cells"]] == ["a = 1", "b = 2"]
        client.json("POST", "api/agent/notebooks/crash.ipynb", {"action": "insert", "content": "after"})
        model = client.json("GET", "api/contents/crash.ipynb?type=notebook&content=1")
        assert [c["source"] for c in model["content"]["cells"]] == ["a = 1", "b = 2", "after"]
    assert sources_of(path.read_text()) == ["a = 1", "b = 2", "after"]
    assert not copy.exists()


SAVES, READS = 10, 20


def test_reads_never_see_a_half_written_notebook(tmp_path: Path) -> None:
    """Read the notebook without pause, READS times at least, through SAVES saves of it (3 MB each)."""
    root = tmp_path / "root"
    root.mkdir()
    nbformat.write(big_notebook(3.0), str(root / "crash.ipynb"))
    torn: list[str] = []
    reads = 0
    with jupyter_server(root) as server:
        stop = threading.Event()
        acked: list[str] = []
        writer = threading.Thread(target=stream_edits, args=(server, acked, [], stop, 0), daemon=True)
        writer.start()
        deadline = time.monotonic() + 120  # a hang guard: the saves end the reading
        with server.client() as client:
            while (len(acked) < SAVES or reads < READS) and time.monotonic() < deadline and not torn:
                status, body = client.request("GET", "api/agent/notebooks/crash.ipynb")
                reads += 1
                if status != 200:
                    torn.append(body[:200].decode(errors="replace"))
        stop.set()
        writer.join(timeout=30)
    assert torn == []
    assert len(acked) >= SAVES and reads >= READS, f"{len(acked)} saves and {reads} reads in 120 s"


@pytest.mark.load
@pytest.mark.timeout(300)
def test_load_loses_nothing_and_leaks_nothing() -> None:
    """About 8 s of six concurrent agents (benchmarks/load.py; ``python -m benchmarks
    load``: 60 s): shared-notebook edits, evals, contents-API saves beside agent reads, refused hostile
    requests."""
    report = run_load(duration=float(os.environ.get("LOAD_SECONDS", "8")), agents=6, sessions=3)
    assert report.problems == []
    assert (
        report.counts["edit"] > 0 and report.counts["eval (json)"] > 0 and report.counts["eval (stream)"] > 0
    )
    assert report.counts["contents save"] > 0 and report.counts["hostile"] > 0
    assert report.kernels_after == report.kernels_before == 3
