"""Large, real-shaped notebooks generated deterministically, for tests and benchmarks of notebook reads.

Shaped like the notebooks of a data-science project: code cells with short and very long stream output,
matplotlib-like PNG figures, pandas-like DataFrames (``text/html`` plus ``text/plain``), errors with
colored tracebacks, markdown with an image attachment, cell tags and metadata. The same arguments give
the same bytes.
"""

from __future__ import annotations

import base64
import random

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

KERNELSPEC = {"name": "python3", "language": "python", "display_name": "Python 3"}


def _png(rng: random.Random, size: int) -> str:
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + rng.randbytes(max(0, size - 8))).decode()


def _dataframe(rng: random.Random, rows: int) -> tuple[str, str]:
    """(text/html, text/plain) of a DataFrame-like table, as pandas renders them."""
    values = [[rng.randint(0, 999), round(rng.random(), 6), rng.choice("abcde") * 3] for _ in range(rows)]
    head = '<thead><tr style="text-align: right;"><th></th><th>n</th><th>x</th><th>label</th></tr></thead>'
    body = "".join(
        f"<tr><th>{i}</th><td>{n}</td><td>{x}</td><td>{label}</td></tr>"
        for i, (n, x, label) in enumerate(values)
    )
    html = f'<div>\n<table border="1" class="dataframe">\n{head}\n<tbody>{body}</tbody>\n</table>\n</div>'
    plain = "     n         x label\n" + "\n".join(
        f"{i:<4} {n:>3}  {x:.6f}   {label}" for i, (n, x, label) in enumerate(values)
    )
    return html, plain


def large_notebook(
    n_cells: int = 300,
    *,
    seed: int = 0,
    image_every: int = 10,
    image_bytes: int = 40_000,
    long_output_every: int = 25,
    long_output_lines: int = 2000,
    table_every: int = 15,
    table_rows: int = 60,
) -> nbformat.NotebookNode:
    """A notebook of ``n_cells`` cells with ids ``cell-<i>`` (see the module docstring)."""
    rng = random.Random(seed)
    cells = []
    for i in range(n_cells):
        if i % 9 == 4:
            cell = new_markdown_cell(f"## Step {i}\n\nWe look at *step {i}* of the analysis, with ünïcode ✓.")
            if i % 45 == 4:
                cell.source += f"\n\n![diagram](attachment:diagram-{i}.png)"
                cell["attachments"] = {f"diagram-{i}.png": {"image/png": _png(rng, 2_000)}}
        else:
            outputs = [new_output("stream", name="stdout", text=f"step {i}\nvalue = {rng.random():.6f}\n")]
            if long_output_every and i % long_output_every == 1:
                lines = [
                    f"epoch {k}: loss={rng.random():.5f} acc={rng.random():.4f}"
                    for k in range(long_output_lines)
                ]
                outputs.append(new_output("stream", name="stderr", text="\n".join(lines) + "\n"))
            if image_every and i % image_every == 0:
                outputs.append(
                    new_output(
                        "display_data",
                        data={
                            "image/png": _png(rng, image_bytes),
                            "text/plain": "<Figure size 640x480 with 1 Axes>",
                        },
                        metadata={"image/png": {"width": 640, "height": 480}},
                    )
                )
            if table_every and i % table_every == 7:
                html, plain = _dataframe(rng, table_rows)
                outputs.append(
                    new_output(
                        "execute_result", execution_count=i + 1, data={"text/html": html, "text/plain": plain}
                    )
                )
            if i % 97 == 50:
                outputs.append(
                    new_output(
                        "error",
                        ename="ValueError",
                        evalue=f"bad value at step {i}",
                        traceback=[
                            "\x1b[0;31m---------------------------------------------------------------\x1b[0m",
                            "\x1b[0;31mValueError\x1b[0m                Traceback (most recent call last)",
                            f"Cell \x1b[0;32mIn[{i + 1}], line 3\x1b[0m\n"
                            "\x1b[0;32m----> 3\x1b[0m check(value)",
                            f"\x1b[0;31mValueError\x1b[0m: bad value at step {i}",
                        ],
                    )
                )
            cell = new_code_cell(
                f"import math\nvalue = math.sqrt({i})\nprint('step {i}')\nplot(value)  # figure {i}",
                execution_count=i + 1,
                outputs=outputs,
            )
            if i % 11 == 0:
                cell.metadata["tags"] = ["parameters"] if i == 0 else ["figure", f"step-{i}"]
                cell.metadata["collapsed"] = False
        cell["id"] = f"cell-{i}"
        cells.append(cell)
    nb = new_notebook(cells=cells, metadata={"kernelspec": dict(KERNELSPEC)})
    nb.nbformat_minor = 5
    return nb
