"""Shared test data: sample notebooks and images (one copy for every test module)."""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell

# A real 1x1 PNG (decodes as an image), and PNG-looking bytes of a known size for placeholders.
PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
PNG_BYTES = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
PNG = base64.b64encode(PNG_BYTES).decode()
KERNELSPEC = {"name": "python3", "language": "python", "display_name": "Python 3"}


def sample_notebook(minor: int = 5, *, unicode: bool = False) -> nbformat.NotebookNode:
    """Every cell type and every kind of output, ids ``cell-0``... (none below nbformat 4.5).

    ``unicode``: non-ASCII text everywhere, multi-line HTML and raw text, and a markdown cell with an
    image attachment.
    """
    title = "# Titre — été 😀\n\n![x](attachment:x.png)" if unicode else "# Title\n\nSome *text*."
    markdown = new_markdown_cell(title)
    if unicode:
        markdown["attachments"] = {"x.png": {"image/png": PNG}}
    cells = [
        markdown,
        new_code_cell(
            "import math\nprint(math.pi)",
            execution_count=1,
            outputs=[
                new_output(
                    "stream",
                    name="stdout",
                    text="3.141592653589793\nπ ≈ 3.14\n" if unicode else "3.141592653589793\n",
                )
            ],
        ),
        new_code_cell(
            "plot()",
            execution_count=2,
            outputs=[
                new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure size 640x480>"}),
                new_output(
                    "execute_result",
                    execution_count=2,
                    data={
                        "text/html": "<b>gras</b>\n<i>ü</i>" if unicode else "<b>bold</b>",
                        "text/plain": "Bold",
                    },
                ),
            ],
        ),
        new_code_cell(
            "1/0",
            execution_count=3,
            outputs=[
                new_output(
                    "error",
                    ename="ZeroDivisionError",
                    evalue="division by zero",
                    traceback=["\x1b[31mZeroDivisionError\x1b[0m: division by zero"],
                )
            ],
        ),
        new_raw_cell("raw text\nline 2" if unicode else "raw text"),
    ]
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i}"
    nb = new_notebook(cells=cells, metadata={"kernelspec": dict(KERNELSPEC)})
    nb.nbformat_minor = minor
    if minor < 5:
        for cell in nb.cells:
            del cell["id"]
    return nb


def write_nb(root: Path, name: str, nb: nbformat.NotebookNode) -> Path:
    """Write ``nb`` as nbformat (and JupyterLab) would, creating folders; return its path."""
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path
