"""The change ledger's costs (issue 26): a notebook run with and without recording, listing 200 changes,
and the database's size under a loop of 10,000 edits.

- ``run of 50 trivial cells``: ``POST .../run {"all": true}`` of a notebook of 50 cells ``x = i``, on two
  servers side by side, one with the ledger (one entry per run, merged from the run's 100 writes) and one
  with it off (``Ledger.max_changes_per_notebook=0``); interleaved, after an untimed warm-up run that
  starts each notebook's kernel. Target: recording adds at most 10%.
- ``list 200 changes``: ``GET .../changes?limit=200`` of a notebook with 200 recorded edits. Target: under
  50 ms at the median.
- ``10,000 edits``: one edit of about 4 KB of fresh (incompressible) source after another, with
  ``Ledger.max_bytes`` at 4 MiB (and no per-notebook cap) so that the byte limit prunes; the database
  file and its write-ahead log are measured every 50 edits. Target: never over the limit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import urllib.parse
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from .common import BenchResult, Row, jupyter_server, run_meta

NAME = "ledger"
TITLE = "Change ledger: a run with and without recording, listing 200 changes, size under 10,000 edits"

RUN, RUN_BARE = "run, ledger on", "run, ledger off"
LIST = "GET .../changes?limit=200"
LIMIT_BYTES = 4 * 1024 * 1024


def _notebook(n_cells: int) -> nbformat.NotebookNode:
    nb = new_notebook(cells=[new_code_cell(f"x = {i}", id=f"c{i}") for i in range(n_cells)])
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nb.nbformat_minor = 5
    return nb


def _db_bytes(path: Path) -> int:
    return sum(
        os.path.getsize(f"{path}{suffix}") for suffix in ("", "-wal") if os.path.exists(f"{path}{suffix}")
    )


def run(options: argparse.Namespace) -> BenchResult:
    quick = getattr(options, "quick", False)
    rows: list[Row] = []
    notes: list[str] = []
    result = BenchResult(NAME, TITLE, rows, notes=notes, meta=run_meta())

    # -- a run of 50 trivial cells, ledger on and off ------------------------------------------------
    repeat = 3 if quick else 10
    case = "run of 50 trivial cells"
    bare_args = ["--Ledger.max_changes_per_notebook=0"]
    with (
        jupyter_server() as on,
        on.client() as on_client,
        jupyter_server(extra_args=bare_args) as off,
        off.client() as off_client,
    ):
        for server in (on, off):
            nbformat.write(_notebook(50), str(server.root_dir / "run.ipynb"))
        samples: dict[str, list[float]] = {RUN: [], RUN_BARE: []}
        clients = {RUN: on_client, RUN_BARE: off_client}
        for i in range(-1, repeat):
            for variant, client in clients.items():
                start = time.perf_counter()
                answer = client.json(
                    "POST", "api/agent/notebooks/run.ipynb/run", {"all": True, "timeout": 120}
                )
                elapsed = time.perf_counter() - start
                assert all(c["status"] == "complete" for c in answer["cells"]), answer["output"]
                if i >= 0:
                    samples[variant].append(elapsed)
        listing = on_client.json("GET", "api/agent/notebooks/run.ipynb/changes?limit=1000")
        assert len(listing["changes"]) == repeat + 1 and listing["changes"][0]["kind"] == "run"
        rows.append(Row(case, RUN_BARE, samples[RUN_BARE]))
        rows.append(Row(case, RUN, samples[RUN], baseline=RUN_BARE))
    result.add_ratio(case, RUN, RUN_BARE, target=1.1, op="<=")
    print(f"  {case}: done", flush=True)

    # -- listing 200 changes, and the size under a loop of edits ---------------------------------------
    edits = 600 if quick else 10_000
    with jupyter_server() as listed, listed.client() as client:
        nbformat.write(_notebook(20), str(listed.root_dir / "list.ipynb"))
        url = "api/agent/notebooks/list.ipynb"
        for i in range(200):
            client.json("POST", url, {"action": "edit", "cell_id": f"c{i % 20}", "content": f"y = {i}"})
        times = []
        for _ in range(10 if quick else 40):
            start = time.perf_counter()
            answer = client.json("GET", url + "/changes?limit=200")
            times.append(time.perf_counter() - start)
            assert len(answer["changes"]) == 200
        rows.append(Row("list 200 changes", LIST, times))
        result.add_check(
            "list 200 changes",
            f"{LIST}: median ms",
            result.row("list 200 changes", LIST).stats["median"] * 1000,
            50,
            unit=" ms",
        )
    print("  list 200 changes: done", flush=True)

    case = f"{edits:,} edits of 4 KB"
    db_dir = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    db = db_dir / "ledger.db"
    limit = LIMIT_BYTES if not quick else 512 * 1024
    args = [
        f"--Ledger.db_path={db}",
        f"--Ledger.max_bytes={limit}",
        "--Ledger.max_changes_per_notebook=1000000",
    ]
    with jupyter_server(extra_args=args) as sized, sized.client() as client:
        nbformat.write(_notebook(20), str(sized.root_dir / "big.ipynb"))
        url = "api/agent/notebooks/" + urllib.parse.quote("big.ipynb")
        sizes: list[int] = []
        durations: list[float] = []
        for i in range(edits):
            content = f"# edit {i}\n" + os.urandom(2000).hex()
            start = time.perf_counter()
            answer = client.json("POST", url, {"action": "edit", "cell_id": f"c{i % 20}", "content": content})
            durations.append(time.perf_counter() - start)
            assert answer["recorded"] is True, answer
            if i % 50 == 49:
                sizes.append(_db_bytes(db))
        listing = client.json("GET", url + "/changes?limit=1000")
        kept = len(listing["changes"])
        oldest_kept = int(listing["changes"][-1]["id"])
    shutil.rmtree(db_dir, ignore_errors=True)
    rows.append(Row(case, "edit (ledger at its byte limit)", durations, extra={"changes kept": kept}))
    peak = max(sizes)
    result.add_check(case, "database + WAL, peak MB", peak / 1e6, limit / 1e6, unit=" MB")
    result.meta["ledger_size"] = {
        "max_bytes": limit,
        "peak_bytes": peak,
        "final_bytes": sizes[-1],
        "changes_kept": kept,
        "oldest_kept_id": oldest_kept,
        "edits": edits,
    }
    notes.append(
        f"{case}: Ledger.max_bytes {limit / 1e6:.1f} MB; the database and its write-ahead log peaked at "
        f"{peak / 1e6:.2f} MB and ended at {sizes[-1] / 1e6:.2f} MB; the newest {kept} changes were kept "
        f"(ids {oldest_kept} to {edits}), the older ones pruned first."
    )
    notes.append(
        "run, ledger on / off: two servers side by side, each running its own copy of the notebook in its "
        "own kernel; the ledger merges the run's 100 writes (clear and outputs of each cell) into one entry."
    )
    return result
