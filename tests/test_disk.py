"""Notebook files on a local disk (jupyter_agent_tools/notebook/disk.py), with real files."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from jupyter_agent_tools.notebook import disk
from jupyter_agent_tools.notebook.format import content_hash

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


def varied_notebook() -> nbformat.NotebookNode:
    """Every kind of JSON token: strings with escapes and non-ASCII, numbers, literals, nesting."""
    nb = new_notebook(
        cells=[
            new_code_cell(
                "x = 'é日本\\u00e9 \"q\" \U0001f600'\n1.5e10",
                execution_count=12,
                outputs=[new_output("stream", name="stdout", text="a\u00e9\n\x1b[31mred\t\n")],
            ),
            new_code_cell("y = [1, -2.5e-3, True, None]"),
        ]
    )
    nb.metadata["numbers"] = [-1.5e-10, 0, 7, 3.25, False, True, None, {"k": "\U0001f600", "e": ""}]
    return nb


@pytest.mark.parametrize("ascii_only", [False, True], ids=["utf8", "ascii-escapes"])
def test_every_prefix_of_a_notebook_looks_cut_off(ascii_only: bool) -> None:
    data = json.dumps(varied_notebook(), indent=1, ensure_ascii=ascii_only).encode()
    assert [n for n in range(len(data)) if not disk.looks_cut_off(data[:n])] == []
    assert not disk.looks_cut_off(data)


@pytest.mark.parametrize(
    "text",
    [
        '{"cells": ]',
        '{"cells": [}',
        '{"cells": []} {"tail": 1}',
        '{"a": 1}\n{"b": 2}\n',
        '{"a": x',
        '{"a": 1 2}',
    ],
)
def test_json_broken_in_the_middle_does_not_look_cut_off(text: str) -> None:
    assert not disk.looks_cut_off(text.encode())


def test_not_utf8_in_the_middle_does_not_look_cut_off() -> None:
    assert disk.looks_cut_off('{"a": "é'.encode()[:-1])
    assert not disk.looks_cut_off(b'{"a": "\xff"}')


def test_save_in_progress_needs_a_recent_change(tmp_path: Path) -> None:
    path = tmp_path / "nb.ipynb"
    path.write_text('{"cells": [')
    assert disk.save_in_progress(str(path), disk.read_snapshot(str(path)))
    old = time.time() - disk.SAVE_IN_PROGRESS_SECONDS - 1
    os.utime(path, (old, old))
    assert not disk.save_in_progress(str(path), disk.read_snapshot(str(path)))


def test_a_recent_file_broken_in_the_middle_is_in_progress_only_next_to_jupyters_copy(tmp_path: Path) -> None:
    path = tmp_path / "nb.ipynb"
    path.write_text('{"cells": []} stale tail')
    assert not disk.save_in_progress(str(path), disk.read_snapshot(str(path)))
    (tmp_path / ".~nb.ipynb").write_text('{"cells": []}')
    assert disk.save_in_progress(str(path), disk.read_snapshot(str(path)))


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return content_hash(text.encode())


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_replace_keeps_permission_bits_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "nb.ipynb"
    old = write(path, "old")
    os.chmod(path, 0o640)
    tmp = disk.write_temporary(str(path), b"new")
    assert disk.replace_if_unchanged(tmp, str(path), old) is None
    assert path.read_text() == "new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert leftovers(tmp_path) == []


def test_a_file_changed_since_it_was_read_is_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "nb.ipynb"
    old = write(path, "old")
    theirs = write(path, "theirs")
    tmp = disk.write_temporary(str(path), b"ours")
    assert disk.replace_if_unchanged(tmp, str(path), old) == theirs
    assert path.read_text() == "theirs"
    assert leftovers(tmp_path) == []


def test_a_file_replaced_between_the_check_and_the_rename_is_put_back(tmp_path, monkeypatch) -> None:
    """Another process renames its file over the notebook right after our check (injected at that point)."""
    if disk._renameat2 is None:
        pytest.skip("not applicable here: no atomic swap of two files (the fallback rename is tested below)")
    path = tmp_path / "nb.ipynb"
    old = write(path, "old")
    swap = disk.exchange

    def replaced_first(a: str, b: str) -> bool:
        (tmp_path / "theirs").write_text("theirs")
        os.replace(tmp_path / "theirs", path)
        monkeypatch.setattr(disk, "exchange", swap)
        return swap(a, b)

    monkeypatch.setattr(disk, "exchange", replaced_first)
    tmp = disk.write_temporary(str(path), b"ours")
    assert disk.replace_if_unchanged(tmp, str(path), old) == content_hash(b"theirs")
    assert path.read_text() == "theirs"
    assert leftovers(tmp_path) == []


def test_without_an_atomic_swap_the_checked_file_is_still_replaced(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(disk, "_renameat2", None)
    path = tmp_path / "nb.ipynb"
    old = write(path, "old")
    tmp = disk.write_temporary(str(path), b"new")
    assert disk.replace_if_unchanged(tmp, str(path), old) is None
    assert path.read_text() == "new" and leftovers(tmp_path) == []


def test_a_removed_file_is_not_recreated(tmp_path: Path) -> None:
    path = tmp_path / "nb.ipynb"
    old = write(path, "old")
    tmp = disk.write_temporary(str(path), b"new")
    path.unlink()
    assert disk.replace_if_unchanged(tmp, str(path), old) == ""
    assert not path.exists() and leftovers(tmp_path) == []
