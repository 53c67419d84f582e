"""Issue 29's budget: a notebook run including its kernel start, against nbclient (papermill's engine).

Three real-shaped notebooks (an analysis with pandas, a matplotlib plot, a plain script with a progress
bar and JSON), each run from a state where the notebook has no kernel:

- ``nbclient``: in this process, ``NotebookClient(nb, kernel_name="python3").execute()`` with the
  notebook's directory as working directory, as papermill runs a notebook: start a kernel, run every
  cell, shut the kernel down (graceful);
- ``agent run, warm pool``: ``POST /api/agent/notebooks/{path}/run`` ``{"all": true}`` on a server with the
  default warm pool (``per_call_pool_size=1``), timed once the pool reports a ready kernel (waiting is not
  timed): the notebook's kernel is the pooled one, adopted as its jupyter_server session's kernel. The
  notebook's session is deleted after each run, untimed (the run leaves the kernel to the notebook, as
  JupyterLab would).

Every repetition runs a fresh copy of the notebook. The outputs both wrote are compared cell by cell
(consecutive stream outputs merged, as JupyterLab stores them; execution counts included).

Target (issue 47, was 0.8 in issue 29): agent run <= 0.6x nbclient, outputs equal on every deterministic cell.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from .common import BenchResult, Row, jupyter_server, profile_path, quick, run_meta, wait_for_pool

NAME = "notebook_run"
TITLE = "A notebook run including kernel start: agent run (warm pool) vs nbclient"
REPEAT, QUICK_REPEAT = 6, 1
NBCLIENT, AGENT = "nbclient (papermill's engine)", "agent run, warm pool"
TARGET = 0.6

NOTEBOOKS: dict[str, list[tuple[str, str]]] = {
    "analysis": [
        ("markdown", "# Sales by region\nA small, deterministic data set."),
        ("code", "import pandas as pd\nimport numpy as np"),
        (
            "code",
            "rng = np.random.default_rng(7)\n"
            "df = pd.DataFrame({'region': np.repeat(['north', 'south', 'east', 'west'], 50),\n"
            "                   'units': rng.integers(1, 100, 200),\n"
            "                   'price': rng.normal(20, 3, 200).round(2)})\n"
            "df['revenue'] = df.units * df.price\n"
            "df.head()",
        ),
        ("code", "df.describe().round(2)"),
        ("code", "summary = df.groupby('region').revenue.agg(['sum', 'mean', 'count']).round(1)\nsummary"),
        ("markdown", "## Checks"),
        ("code", "print(f'total revenue: {df.revenue.sum():,.2f}')\nprint(summary['count'].to_dict())"),
        ("code", "top = summary['sum'].idxmax()\ntop"),
    ],
    "plot": [
        ("code", "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')"),
        ("code", "import matplotlib.pyplot as plt\nimport numpy as np\nx = np.linspace(0, 6.28, 200)"),
        (
            "code",
            "fig, ax = plt.subplots(figsize=(4, 3))\nax.plot(x, np.sin(x))\nax.set_title('sin')\nplt.show()",
        ),
        ("code", "print('points:', len(x))"),
        ("code", "from IPython.display import Markdown\nMarkdown('**done**: one figure')"),
    ],
    "script": [
        ("code", "import json, math, statistics, collections"),
        (
            "code",
            "import sys\nfor i in range(0, 101, 10):\n"
            "    sys.stdout.write(f'\\rprogress {i:3d}%')\n    sys.stdout.flush()\nprint()",
        ),
        ("code", "values = [math.sin(i / 10) for i in range(1000)]\nround(statistics.mean(values), 6)"),
        (
            "code",
            "counts = collections.Counter(int(v * 10) for v in values)\n"
            "print(json.dumps(counts, sort_keys=True))",
        ),
        ("code", "for name in ('alpha', 'beta', 'gamma'):\n    print(name.upper(), len(name))"),
        ("code", "import warnings\nwarnings.warn('a deterministic warning')\n'ok'"),
    ],
}


def make_notebook(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    made = [new_code_cell(src) if kind == "code" else new_markdown_cell(src) for kind, src in cells]
    for i, cell in enumerate(made):
        cell["id"] = f"cell-{i}"
    spec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return new_notebook(cells=made, metadata={"kernelspec": spec})


def _text(value: Any) -> Any:
    return "".join(value) if isinstance(value, list) else value


def normalized(nb: nbformat.NotebookNode) -> list[Any]:
    """Each code cell's outputs and execution count, streams merged (as JupyterLab stores them)."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs: list[dict[str, Any]] = []
        for output in cell.outputs:
            output = json.loads(json.dumps(output))
            if "text" in output:
                output["text"] = _text(output["text"])
            if "data" in output:
                output["data"] = {k: _text(v) for k, v in output["data"].items()}
            last = outputs[-1] if outputs else None
            if output["output_type"] == "stream" and last and last.get("name") == output["name"]:
                last["text"] += output["text"]
            else:
                outputs.append(output)
        for output in outputs:
            if output["output_type"] == "stream":
                # a warning names the cell's file, in a directory named after the kernel's process id
                output["text"] = re.sub(r"ipykernel_\d+", "ipykernel_<pid>", output["text"])
                # JupyterLab resolves "\r" overwrites in what it stores; nbclient keeps them raw
                output["text"] = "\n".join(line.rsplit("\r", 1)[-1] for line in output["text"].split("\n"))
        cells.append({"execution_count": cell.execution_count, "outputs": outputs})
    return cells


def run_nbclient(nb: nbformat.NotebookNode, directory: Path) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    client = NotebookClient(
        nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(directory)}}
    )
    client.execute()
    return nb


def run(options: argparse.Namespace) -> BenchResult:
    repeat = QUICK_REPEAT if quick(options) else REPEAT
    samples: dict[str, dict[str, list[float]]] = {name: {NBCLIENT: [], AGENT: []} for name in NOTEBOOKS}
    compared = {"cells": 0, "equal": 0, "differing": []}
    with (
        tempfile.TemporaryDirectory(prefix="nbclient-bench-") as scratch,
        jupyter_server(profile_to=profile_path(options, NAME)) as server,
        server.client() as client,
    ):
        local = Path(scratch)

        client.json(
            "POST", "api/agent/eval", {"cells": [{"code": "1"}], "mode": "per-call"}
        )  # starts the pool
        counter = 0
        for i in range(-1, repeat):  # i == -1: warm-up (imports, caches), not timed
            for name, cells in NOTEBOOKS.items():
                for variant in (NBCLIENT, AGENT) if (i + len(name)) % 2 == 0 else (AGENT, NBCLIENT):
                    counter += 1
                    nb = make_notebook(cells)
                    if variant == NBCLIENT:
                        start = time.perf_counter()
                        ran = run_nbclient(nb, local)
                        elapsed = time.perf_counter() - start
                        theirs = normalized(ran)
                    else:
                        path = f"{name}-{counter}.ipynb"
                        nbformat.write(nb, str(server.root_dir / path))
                        wait_for_pool(client)
                        start = time.perf_counter()
                        answer = client.json("POST", f"api/agent/notebooks/{path}/run", {"all": True})
                        elapsed = time.perf_counter() - start
                        if any(c["status"] not in ("complete", "skipped") for c in answer["cells"]):
                            raise RuntimeError(f"agent run failed: {answer['output']}")
                        ours = normalized(nbformat.read(str(server.root_dir / path), as_version=4))
                        for session in client.json("GET", "api/sessions"):
                            if session["path"] == path:
                                client.request("DELETE", f"api/sessions/{session['id']}")
                    if i >= 0:
                        samples[name][variant].append(elapsed)
                if i >= 0:
                    for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                        compared["cells"] += 1
                        if a == b:
                            compared["equal"] += 1
                        elif len(compared["differing"]) < 5:
                            compared["differing"].append(
                                {"notebook": name, "code_cell": index, "agent": a, "nbclient": b}
                            )
            print(f"  repetition {i + 1}/{repeat}", flush=True)
    rows = []
    for name in NOTEBOOKS:
        case = f"{name} ({sum(k == 'code' for k, _ in NOTEBOOKS[name])} code cells)"
        rows += [
            Row(case, NBCLIENT, samples[name][NBCLIENT]),
            Row(case, AGENT, samples[name][AGENT], baseline=NBCLIENT),
        ]
    every = "all notebooks"
    rows += [
        Row(every, NBCLIENT, [s for n in NOTEBOOKS for s in samples[n][NBCLIENT]]),
        Row(every, AGENT, [s for n in NOTEBOOKS for s in samples[n][AGENT]], baseline=NBCLIENT),
    ]
    result = BenchResult(NAME, TITLE, rows, meta=run_meta())
    for row in rows:
        if row.variant == AGENT and row.case != every:
            result.add_ratio(row.case, AGENT, NBCLIENT)
    ratio = result.add_ratio(every, AGENT, NBCLIENT, target=TARGET)
    result.add_check(
        every, "code cells whose outputs differ from nbclient's", compared["cells"] - compared["equal"], 0
    )
    result.meta.update(repetitions=repeat, compared_cells=compared["cells"], differing=compared["differing"])
    result.notes += [
        f"Median over every run: the agent run takes {ratio['median_ratio']:.2f}x nbclient's time "
        f"(target <= {TARGET:g}x). nbclient starts a kernel for the notebook and shuts it down at the end "
        "(papermill's way); the agent run takes a warm kernel from the pool, adopted by jupyter_server as "
        "the notebook's session kernel (moved into the notebook's directory, JPY_SESSION_NAME set) and "
        "left running for the notebook, as JupyterLab leaves it; its answer also carries each cell's "
        "text for a model and the run is written into the file cell by cell (clear, then outputs).",
        f"Outputs compared on {compared['cells']} code cells (execution counts included; consecutive "
        "stream outputs merged and carriage-return overwrites resolved on nbclient's side, as JupyterLab "
        "stores them; the kernel's process id in a warning's file path, ipykernel_<pid>, is the one part "
        f"no two kernels share and is masked): {compared['equal']} equal.",
        f"{repeat} repetitions after one untimed warm-up round; the two variants interleaved, alternating "
        "which goes first; each run on a fresh copy of the notebook.",
    ]
    return result
