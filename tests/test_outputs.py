"""A cell's stored outputs built from iopub messages, as JupyterLab stores them."""

from __future__ import annotations

import io

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_agent_tools.execution.messages import read_iopub
from jupyter_agent_tools.notebook.outputs import CellOutputs

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


def add(outputs: CellOutputs, msg_type: str, content: dict) -> bool:
    """Give ``outputs`` one iopub message, read as the executor reads it."""
    return outputs.add(read_iopub(msg_type, content))


def stream(text: str, name: str = "stdout") -> dict:
    return {"name": name, "text": text}


def valid(outputs: list[dict]) -> None:
    nb = new_notebook(cells=[new_code_cell("x", outputs=outputs, execution_count=1)])
    nbformat.validate(nb)


def test_consecutive_chunks_of_one_stream_merge_and_split_into_lines():
    out = CellOutputs()
    add(out, "stream", stream("a\nb"))
    add(out, "stream", stream("c\n"))
    add(out, "stream", stream("oops\n", "stderr"))
    add(out, "stream", stream("d\n"))
    result = out.to_nbformat()
    assert result == [
        {"output_type": "stream", "name": "stdout", "text": ["a\n", "bc\n"]},
        {"output_type": "stream", "name": "stderr", "text": ["oops\n"]},
        {"output_type": "stream", "name": "stdout", "text": ["d\n"]},
    ]
    valid(result)


def test_progress_bars_keep_their_last_state():
    out = CellOutputs()
    for pct in (10, 50, 100):
        add(out, "stream", stream(f"\r{pct}%"))
    add(out, "stream", stream("\ndone\n"))
    assert out.to_nbformat()[0]["text"] == ["100%\n", "done\n"]


def test_results_displays_errors_and_execution_count():
    out = CellOutputs()
    add(out, "execute_input", {"execution_count": 7, "code": "x"})
    png = "iVBORw0KGgo="
    add(out, "display_data", {"data": {"image/png": png, "text/plain": "<Figure>"}, "metadata": {}})
    add(out, "execute_result", {"data": {"text/plain": "1\n2"}, "metadata": {}, "execution_count": 7})
    tb = ["\x1b[31mTraceback\x1b[0m", "ValueError: bad"]
    add(out, "error", {"ename": "ValueError", "evalue": "bad", "traceback": tb})
    result = out.to_nbformat()
    assert out.execution_count == 7
    assert result[0]["data"] == {"image/png": png, "text/plain": ["<Figure>"]}
    assert result[1] == {
        "output_type": "execute_result",
        "data": {"text/plain": ["1\n", "2"]},
        "metadata": {},
        "execution_count": 7,
    }
    assert result[2]["traceback"] == tb  # exactly as the kernel sent it
    valid(result)


def test_clear_output_now_and_on_the_next_output():
    out = CellOutputs()
    add(out, "stream", stream("old\n"))
    assert add(out, "clear_output", {"wait": False})
    assert out.to_nbformat() == []
    add(out, "stream", stream("frame 1\n"))
    add(out, "clear_output", {"wait": True})
    assert out.to_nbformat()[0]["text"] == ["frame 1\n"]  # kept until something new arrives
    add(out, "stream", stream("frame 2\n"))
    assert out.to_nbformat() == [{"output_type": "stream", "name": "stdout", "text": ["frame 2\n"]}]


def test_update_display_data_replaces_by_display_id():
    out = CellOutputs()
    shown = {"display_id": "p"}
    add(out, "display_data", {"data": {"text/plain": "0%"}, "metadata": {}, "transient": shown})
    add(out, "stream", stream("working\n"))
    add(out, "update_display_data", {"data": {"text/plain": "100%"}, "metadata": {}, "transient": shown})
    result = out.to_nbformat()
    assert result[0] == {"output_type": "display_data", "data": {"text/plain": ["100%"]}, "metadata": {}}
    assert "transient" not in result[0]
    valid(result)


def test_huge_text_is_bounded_with_a_note_and_spilled_whole():
    spilled: dict[str, bytes] = {}

    class Sink(io.BytesIO):
        def close(self) -> None:
            spilled["a1"] = self.getvalue()
            super().close()

    out = CellOutputs(max_text_bytes=1000, open_artifact=lambda: ("a1", Sink()))
    text = "".join(f"line {i}\n" for i in range(10_000))
    add(out, "stream", stream(text))
    out.close()
    (result,) = out.to_nbformat()
    stored = "".join(result["text"])
    assert len(stored.encode()) < 1200
    assert stored.startswith("line 0\n") and "[Output truncated: showing" in stored
    assert (
        f"of {len(text)} bytes (NotebookRunner.max_output_bytes_stored)" in stored and "artifact a1" in stored
    )
    assert spilled["a1"].decode() == text


class Artifacts:
    """Artifacts in memory, as ``open_artifact`` gives them: id -> bytes written (also after close)."""

    def __init__(self) -> None:
        self.files: dict[str, io.BytesIO] = {}

    def open(self) -> tuple[str, io.BytesIO]:
        artifact_id = f"a{len(self.files)}"
        handle = io.BytesIO()
        handle.close = lambda: None  # type: ignore[method-assign]  # keep the bytes readable
        self.files[artifact_id] = handle
        return artifact_id, handle

    def lines(self, artifact_id: str) -> list[dict]:
        import json

        return [json.loads(line) for line in self.files[artifact_id].getvalue().decode().splitlines()]


def display(text: str, display_id: str | None = None) -> dict:
    content: dict = {"data": {"text/plain": text}, "metadata": {}}
    if display_id:
        content["transient"] = {"display_id": display_id}
    return content


def test_outputs_past_max_bytes_become_one_placeholder_and_go_to_one_artifact():
    artifacts = Artifacts()
    out = CellOutputs(max_bytes=10_000, open_artifact=artifacts.open)
    for i in range(50):
        add(out, "display_data", display(f"{i:02d}" + "z" * 998))
    png = "iVBORw0KGgo=" * 2000  # an image counts like any output
    add(out, "display_data", {"data": {"image/png": png}, "metadata": {}})
    add(out, "stream", stream("after\n"))
    add(out, "stream", stream("more\n"))  # the same stream output, left out
    out.close()
    result = out.to_nbformat()
    kept, placeholder = result[:-1], result[-1]
    assert [o["data"]["text/plain"][0][:2] for o in kept] == [f"{i:02d}" for i in range(len(kept))]
    assert 5 <= len(kept) < 10
    omitted = out.omitted()
    assert omitted is not None and omitted["outputs"] == 50 - len(kept) + 2 and omitted["artifact_id"] == "a0"
    assert omitted["bytes"] == (50 - len(kept)) * 1000 + len(png) + len("after\nmore\n")
    text = "".join(placeholder["data"]["text/plain"])
    assert (
        f"{omitted['outputs']} outputs" in text
        and "NotebookRunner.max_cell_bytes_stored" in text
        and "artifact a0" in text
    )
    assert placeholder["metadata"] == {"jupyter_agent_tools": {"omitted": omitted}}
    lines = artifacts.lines("a0")
    assert lines[0]["data"]["text/plain"].startswith(f"{len(kept):02d}")
    assert lines[-3]["data"]["image/png"] == png
    assert [line.get("text") for line in lines[-2:]] == ["after\n", "more\n"]
    valid(result)


def test_only_what_is_stored_counts_clear_output_starts_the_cell_and_its_artifact_over():
    artifacts = Artifacts()
    out = CellOutputs(max_bytes=10_000, open_artifact=artifacts.open)
    for frame in range(100):  # a progress loop: clear_output(wait=True), then the next frame
        add(out, "clear_output", {"wait": True})
        add(out, "display_data", display(f"frame {frame} " + "f" * 2000))
    assert [o["data"]["text/plain"][0][:9] for o in out.to_nbformat()] == ["frame 99 "]
    assert out.omitted() is None
    for frame in range(100):  # frames larger than the cell: each is left out, the artifact holds the last
        add(out, "clear_output", {"wait": True})
        add(out, "display_data", display(f"big {frame} " + "b" * 20_000))
    (placeholder,) = out.to_nbformat()
    assert "1 output " in "".join(placeholder["data"]["text/plain"])
    (line,) = artifacts.lines("a0")
    assert line["data"]["text/plain"].startswith("big 99 ")
    assert len(artifacts.files) == 1


def test_a_display_update_past_max_bytes_is_left_out_and_the_display_says_where():
    artifacts = Artifacts()
    out = CellOutputs(max_bytes=10_000, open_artifact=artifacts.open)
    add(out, "display_data", display("0%", "p"))
    add(out, "update_display_data", display("u" * 20_000, "p"))
    shown, _ = out.to_nbformat()
    assert "is not stored in the notebook" in shown["data"]["text/plain"][0] and "artifact a0" in str(shown)
    assert out.omitted() == {"outputs": 0, "updates": 1, "bytes": 20_000, "artifact_id": "a0"}
    assert artifacts.lines("a0")[0]["display_id"] == "p"
    add(out, "update_display_data", display("100%", "p"))  # a smaller update fits again
    assert out.to_nbformat()[0]["data"]["text/plain"] == ["100%"]
    for _ in range(20):  # a display that was left out: its updates go to the artifact
        add(out, "display_data", display("x" * 1000, "q"))
    add(out, "update_display_data", display("q done", "q"))
    assert artifacts.lines("a0")[-1] == {
        "output_type": "update_display_data",
        "display_id": "q",
        "data": {"text/plain": "q done"},
        "metadata": {},
    }


def test_a_stream_past_the_cells_room_is_cut_there_and_spilled_whole():
    artifacts = Artifacts()
    out = CellOutputs(max_bytes=10_000, max_text_bytes=100_000, open_artifact=artifacts.open)
    add(out, "display_data", display("d" * 5000))
    text = "".join(f"line {i}\n" for i in range(5000))
    for start in range(0, len(text), 777):  # in chunks, as a kernel sends a long print
        add(out, "stream", stream(text[start : start + 777]))
    out.close()
    _, result = out.to_nbformat()
    stored = "".join(result["text"])
    assert stored.startswith("line 0\n") and len(stored.encode()) < 5000
    assert f"of {len(text)} bytes (NotebookRunner.max_cell_bytes_stored). Full output: artifact a0" in stored
    assert artifacts.files["a0"].getvalue().decode() == text


class Discard(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, data) -> int:  # type: ignore[override]
        return len(data)


def test_memory_holds_what_is_stored_not_what_was_sent():
    import tracemalloc

    out = CellOutputs(max_bytes=1_000_000, open_artifact=lambda: ("a", Discard()))
    tracemalloc.start()
    try:
        for i in range(300):  # 30 MB of distinct displays, then 30 MB of distinct stream chunks
            add(out, "display_data", display(f"{i}" + "z" * 100_000))
        for i in range(300):
            add(out, "stream", stream(f"{i}" + "s" * 100_000 + "\n", "stderr"))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 3_000_000, f"{held} bytes held for 60 MB of output"


def test_a_flood_of_empty_outputs_is_bounded_too():
    out = CellOutputs(max_bytes=10_000, open_artifact=lambda: ("a", io.BytesIO()))
    for _ in range(10_000):
        add(out, "display_data", {"data": {}, "metadata": {}})
    result = out.to_nbformat()
    assert len(result) <= 10_000 // 100 + 1 and out.omitted()["outputs"] == 10_000 - (len(result) - 1)
