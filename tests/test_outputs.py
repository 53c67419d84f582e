"""A cell's stored outputs built from iopub messages, as JupyterLab stores them."""

from __future__ import annotations

import io

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_agent_tools.notebook.outputs import CellOutputs


def stream(text: str, name: str = "stdout") -> dict:
    return {"name": name, "text": text}


def valid(outputs: list[dict]) -> None:
    nb = new_notebook(cells=[new_code_cell("x", outputs=outputs, execution_count=1)])
    nbformat.validate(nb)


def test_consecutive_chunks_of_one_stream_merge_and_split_into_lines():
    out = CellOutputs()
    out.add("stream", stream("a\nb"))
    out.add("stream", stream("c\n"))
    out.add("stream", stream("oops\n", "stderr"))
    out.add("stream", stream("d\n"))
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
        out.add("stream", stream(f"\r{pct}%"))
    out.add("stream", stream("\ndone\n"))
    assert out.to_nbformat()[0]["text"] == ["100%\n", "done\n"]


def test_results_displays_errors_and_execution_count():
    out = CellOutputs()
    out.add("execute_input", {"execution_count": 7, "code": "x"})
    png = "iVBORw0KGgo="
    out.add("display_data", {"data": {"image/png": png, "text/plain": "<Figure>"}, "metadata": {}})
    out.add("execute_result", {"data": {"text/plain": "1\n2"}, "metadata": {}, "execution_count": 7})
    tb = ["\x1b[31mTraceback\x1b[0m", "ValueError: bad"]
    out.add("error", {"ename": "ValueError", "evalue": "bad", "traceback": tb})
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
    out.add("stream", stream("old\n"))
    assert out.add("clear_output", {"wait": False})
    assert out.to_nbformat() == []
    out.add("stream", stream("frame 1\n"))
    out.add("clear_output", {"wait": True})
    assert out.to_nbformat()[0]["text"] == ["frame 1\n"]  # kept until something new arrives
    out.add("stream", stream("frame 2\n"))
    assert out.to_nbformat() == [{"output_type": "stream", "name": "stdout", "text": ["frame 2\n"]}]


def test_update_display_data_replaces_by_display_id():
    out = CellOutputs()
    shown = {"display_id": "p"}
    out.add("display_data", {"data": {"text/plain": "0%"}, "metadata": {}, "transient": shown})
    out.add("stream", stream("working\n"))
    out.add("update_display_data", {"data": {"text/plain": "100%"}, "metadata": {}, "transient": shown})
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
    out.add("stream", stream(text))
    out.close()
    (result,) = out.to_nbformat()
    stored = "".join(result["text"])
    assert len(stored.encode()) < 1200
    assert stored.startswith("line 0\n") and "[Output truncated: showing" in stored
    assert f"of {len(text)} bytes (max_run_output_bytes)" in stored and "artifact a1" in stored
    assert spilled["a1"].decode() == text
