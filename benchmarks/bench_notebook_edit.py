"""Benchmark 3 of issue 6: latency of one ``edit`` of one cell, against the nbformat floor and /api/contents.

For notebooks of 10, 1,000 and 5,000 cells (the large one ~27 MB, with a PNG output on every tenth cell),
each repetition measures, interleaved, on three identical copies of the notebook:

- ``nbformat floor``: ``nbformat.read`` + change one cell's source + ``nbformat.write``, in this process;
- ``agent edit``: ``POST /api/agent/notebooks/{path}`` with ``{"action": "edit", "cell_index": mid, ...}``;
- ``contents GET+PUT``: what a naive agent does today: ``GET /api/contents/{path}``, change the cell in the
  parsed JSON, ``PUT`` the whole notebook back.

- ``agent edit, no ledger``: the same edit on a second server whose change ledger is off
  (``Ledger.max_changes_per_notebook=0``): what recording each change in the ledger costs.

Targets: agent edit <= 1.3x the nbformat floor at the median, and faster than the contents round trip;
recording in the change ledger adds at most 10% from 1,000 cells on (agent edit <= 1.1x agent edit, no
ledger).
"""

from __future__ import annotations

import argparse
import base64
import random
import shutil
import time
import urllib.parse
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from .common import BenchResult, Row, jupyter_server, run_meta

NAME = "notebook_edit"
TITLE = "Notebook edit latency: one cell edit vs nbformat read+write vs /api/contents GET+PUT"

# (cells, an image output every k cells, repetitions)
SIZES = [(10, 5, 40), (1000, 10, 12), (5000, 10, 5)]
QUICK_SIZES = [(10, 5, 3), (200, 10, 3)]
IMAGE_BYTES = 40_000  # raw bytes per PNG output (about 53 KB of base64)

FLOOR, AGENT, CONTENTS = "nbformat floor", "agent edit", "contents GET+PUT"
NO_LEDGER = "agent edit, no ledger"
HTTP = "HTTP no-op (GET /api/status)"


def make_notebook(n_cells: int, image_every: int, seed: int = 0) -> nbformat.NotebookNode:
    """A deterministic notebook: code cells with stream output, some markdown, PNG outputs every k cells."""
    rng = random.Random(seed)
    cells = []
    for i in range(n_cells):
        if i % 7 == 3:
            cell = new_markdown_cell(f"## Section {i}\n\nSome *text* about step {i}, with ünïcode ✓.")
        else:
            outputs = [new_output("stream", name="stdout", text=f"step {i}\nvalue = {rng.random():.6f}\n")]
            if i % image_every == 0:
                png = b"\x89PNG\r\n\x1a\n" + rng.randbytes(IMAGE_BYTES - 8)
                outputs.append(
                    new_output(
                        "display_data",
                        data={"image/png": base64.b64encode(png).decode(), "text/plain": "<Figure>"},
                    )
                )
            cell = new_code_cell(
                f"import math\nvalue = math.sqrt({i})\nprint('step {i}')\nvalue",
                execution_count=i + 1,
                outputs=outputs,
            )
        cell["id"] = f"cell-{i}"
        cells.append(cell)
    nb = new_notebook(
        cells=cells,
        metadata={"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}},
    )
    nb.nbformat_minor = 5
    return nb


def n_cells_of(case: str) -> int:
    """The number of cells a case's name starts with ("1000 cells (4.9 MB)" -> 1000)."""
    return int(case.split()[0])


def _content(i: int) -> str:
    return f"value = {i}\nprint(value)"


def run(options: argparse.Namespace) -> BenchResult:
    sizes = QUICK_SIZES if getattr(options, "quick", False) else SIZES
    rows: list[Row] = []
    notes: list[str] = []
    no_ledger_args = ["--Ledger.max_changes_per_notebook=0"]
    with (
        jupyter_server() as server,
        server.client() as client,
        jupyter_server(extra_args=no_ledger_args) as bare,
        bare.client() as bare_client,
    ):
        root = server.root_dir
        for n_cells, image_every, repeat in sizes:
            base = root / f"nb{n_cells}.ipynb"
            nbformat.write(make_notebook(n_cells, image_every), str(base))
            size_mb = base.stat().st_size / 1e6
            case = f"{n_cells} cells ({size_mb:.1f} MB)"
            paths = {}
            for variant in (FLOOR, AGENT, CONTENTS):
                path = root / f"nb{n_cells}-{variant.split()[0]}.ipynb"
                shutil.copyfile(base, path)
                paths[variant] = path
            paths[NO_LEDGER] = bare.root_dir / paths[AGENT].name
            shutil.copyfile(base, paths[NO_LEDGER])
            # The contents round trip alternates between the two servers, so that both carry the same load
            # (it allocates the whole notebook as Python objects) and only the ledger differs.
            contents_paths = [paths[CONTENTS], bare.root_dir / paths[CONTENTS].name]
            shutil.copyfile(base, contents_paths[1])
            mid = n_cells // 2
            agent_url = "api/agent/notebooks/" + urllib.parse.quote(paths[AGENT].name)
            contents_url = "api/contents/" + urllib.parse.quote(paths[CONTENTS].name)

            def floor(i: int, path: Path = paths[FLOOR], mid: int = mid) -> None:
                nb = nbformat.read(str(path), as_version=4)
                nb.cells[mid].source = _content(i)
                nbformat.write(nb, str(path))

            def agent(i: int, url: str = agent_url, mid: int = mid) -> None:
                client.json("POST", url, {"action": "edit", "cell_index": mid, "content": _content(i)})

            def no_ledger(i: int, url: str = agent_url, mid: int = mid) -> None:
                bare_client.json("POST", url, {"action": "edit", "cell_index": mid, "content": _content(i)})

            def contents(i: int, url: str = contents_url, mid: int = mid) -> None:
                on = (client, bare_client)[i % 2]
                model = on.json("GET", url + "?type=notebook&content=1")
                nb = model["content"]
                nb["cells"][mid]["source"] = _content(i)
                on.json("PUT", url, {"type": "notebook", "format": "json", "content": nb})

            def http_noop(i: int) -> None:
                client.json("GET", "api/status")

            samples: dict[str, list[float]] = {FLOOR: [], AGENT: [], NO_LEDGER: [], CONTENTS: [], HTTP: []}
            funcs = {FLOOR: floor, AGENT: agent, NO_LEDGER: no_ledger, CONTENTS: contents, HTTP: http_noop}
            for i in range(-1, repeat):  # i == -1: warm-up, not timed; variants interleaved
                order = list(funcs) if i % 2 == 0 else [FLOOR, NO_LEDGER, AGENT, CONTENTS, HTTP]
                for variant in order:
                    fn = funcs[variant]
                    start = time.perf_counter()
                    fn(i)
                    elapsed = time.perf_counter() - start
                    if i >= 0:
                        samples[variant].append(elapsed)
            # The edits landed and left valid notebooks.
            paths[CONTENTS] = contents_paths[(repeat - 1) % 2]
            for variant, path in paths.items():
                nb = nbformat.read(str(path), as_version=4)
                nbformat.validate(nb)
                assert nb.cells[mid].source == _content(repeat - 1), (variant, nb.cells[mid].source)
                assert len(nb.cells) == n_cells
            rows.append(Row(case, FLOOR, samples[FLOOR]))
            rows.append(Row(case, AGENT, samples[AGENT], baseline=FLOOR))
            rows.append(Row(case, NO_LEDGER, samples[NO_LEDGER], baseline=FLOOR))
            rows.append(Row(case, CONTENTS, samples[CONTENTS], baseline=FLOOR))
            rows.append(Row(case, HTTP, samples[HTTP], baseline=FLOOR))
            print(f"  {case}: done", flush=True)
        rss = server.rss_bytes()
    result = BenchResult(NAME, TITLE, rows, notes=notes, meta=run_meta())
    result.meta["server_rss_mb_at_end"] = None if rss is None else round(rss / 1e6, 1)
    result.meta["sizes"] = [
        {"cells": n, "image_every": k, "image_raw_bytes": IMAGE_BYTES, "repetitions": r} for n, k, r in sizes
    ]
    for case in dict.fromkeys(r.case for r in rows):
        result.add_ratio(case, AGENT, FLOOR, target=1.3, op="<=")
        result.add_ratio(case, AGENT, CONTENTS, target=1.0, op="<")
        # Issue 26: recording adds at most 10% from 1,000 cells on; a small notebook's edit pays its fixed
        # cost (one round trip to the ledger's thread and one SQLite commit, about 1 ms), shown untargeted.
        small = n_cells_of(case) < 1000
        result.add_ratio(case, AGENT, NO_LEDGER, target=None if small else 1.1, op="<=")
    notes.append(
        "nbformat floor = nbformat.read + set one cell's source + nbformat.write, in the benchmark process "
        "(both nbformat calls validate). agent edit = POST /api/agent/notebooks (parse, apply, validate, "
        "serialize, save through the contents manager, over HTTP). contents GET+PUT = GET /api/contents "
        "?type=notebook, edit the parsed JSON, PUT it back (client JSON work included)."
    )
    notes.append(
        "HTTP no-op = GET /api/status on the same keep-alive connection: the fixed cost of one authenticated "
        "request through Tornado and jupyter_server, which the agent edit pays and the in-process floor does "
        "not (about 1-2 ms here)."
    )
    notes.append(
        "Where the small-notebook time goes (cProfile of NotebookStore.edit in-process on the 10-cell "
        "notebook): about 70% is FileContentsManager.save's atomic_writing (copy of the old file aside, "
        "write, fsync), durability the plain nbformat.write floor does not pay; loading, applying, "
        "validating and serializing are about 2 ms. Saving through the contents manager is a requirement "
        "(root confinement, atomic save, checkpoints, non-disk managers), so the 10-cell ratio is a fixed "
        "few-ms cost, not a scaling one: from 1,000 cells on the edit is below the floor, because it "
        "parses and validates once where nbformat.read and nbformat.write each validate."
    )
    notes.append(
        "agent edit, no ledger = the same edit on a second server started with "
        "Ledger.max_changes_per_notebook=0; agent edit records every edit in the change ledger (SQLite, "
        "awaited in its worker thread) and remembers the new version's per-cell hashes (not awaited)."
    )
    notes.append(
        "Each repetition runs the variants one after another on copies of the same notebook, "
        "after one untimed warm-up round; every edit changes the cell's source."
    )
    return result
