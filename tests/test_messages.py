"""Jupyter iopub content -> eval events, mime bundles, and the combined output a model reads."""

from __future__ import annotations

import json
import re
from typing import Any

import pandas as pd
import pytest
from samples import PNG_1PX

from jupyter_agent_tools.execution import messages
from jupyter_agent_tools.execution.cells import CellExecutor
from jupyter_agent_tools.execution.messages import (
    STATUS_MIMES,
    CellOutcome,
    ClearOutput,
    Display,
    ErrorInfo,
    KernelStatus,
    OutputLimits,
    RichOutput,
    Text,
    bounded_error,
    cell_frame,
    format_combined_output,
)

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


def limits(**given: int) -> OutputLimits:
    """The service's default limits (its traits' defaults), but those ``given``."""
    traits = CellExecutor.class_traits()
    return OutputLimits(
        **{
            "display_bytes": traits["max_display_bytes"].default_value,
            "html_convert_bytes": traits["max_html_convert_bytes"].default_value,
            **given,
        }
    )


def bundle_text(data: dict[str, Any], rich: RichOutput | None = None) -> str | None:
    return messages.bundle_text(data, rich or RichOutput(limits()))


def bundle_displays(data: dict[str, Any], rich: RichOutput | None = None) -> list[dict[str, Any]]:
    return messages.bundle_displays(data, rich or RichOutput(limits()))


def interpret_iopub(msg_type: str, content: dict[str, Any]) -> list[messages.Event]:
    return messages.interpret_iopub(messages.read_iopub(msg_type, content), RichOutput(limits()))


def needs_worker(msg_type: str, content: dict[str, Any], *, storing: bool = False) -> bool:
    read = messages.read_iopub(msg_type, content)
    return read is not None and messages.needs_worker(read, storing=storing)


PNG = PNG_1PX + "\n"  # as a kernel sends it: base64 with a newline
SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>'

# --- bundle_text ---


def test_markdown_beats_plain_and_html() -> None:
    data = {"text/plain": "plain", "text/html": "<b>html</b>", "text/markdown": "**md**"}
    assert bundle_text(data) == "**md**"


def test_plain_beats_html() -> None:
    assert bundle_text({"text/html": "<b>html</b>", "text/plain": "plain"}) == "plain"


def test_no_text_mime_is_none() -> None:
    assert bundle_text({"image/png": PNG}) is None
    assert bundle_text({}) is None


def test_surrounding_blank_lines_stripped_indent_kept() -> None:
    assert bundle_text({"text/plain": "\n  \n    indented\n  body\n\n \n"}) == "    indented\n  body"


def test_multiline_list_value_is_joined() -> None:
    assert bundle_text({"text/plain": ["line 1\n", "line 2"]}) == "line 1\nline 2"


def test_dataframe_html_becomes_a_markdown_table() -> None:
    df = pd.DataFrame({"city_name": ["Oslo", "Lima"], "temp": [3.5, 19.0]})
    for html in (df.to_html(), df._repr_html_()):
        text = bundle_text({"text/html": html})
        assert text is not None
        rows = text.splitlines()
        assert rows[0].replace(" ", "") == "||city_name|temp|"
        assert set(rows[1].replace("|", "").split()) == {"---"}
        assert rows[2].replace(" ", "") == "|0|Oslo|3.5|"
        assert rows[3].replace(" ", "") == "|1|Lima|19.0|"
        assert "<" not in text and "{" not in text  # no tags, no CSS from the <style> block


def test_html_headings_lists_and_scripts() -> None:
    html = "<h2>Report</h2><p>some <b>bold</b></p><ul><li>one</li><li>two</li></ul><script>alert(1)</script>"
    assert bundle_text({"text/html": html}) == "## Report\n\nsome **bold**\n\n- one\n- two"


# --- bundle_displays ---


def test_displays_json_images_status() -> None:
    data = {
        "text/plain": "ignored here",
        "application/json": {"a": [1, 2]},
        "image/png": PNG,
        "image/jpeg": ["/9j/", "4AAQ"],
        "image/gif": "R0lGOD",
        "image/webp": "UklGR",
        "image/svg+xml": SVG,
        STATUS_MIMES[0]: {"phase": "fit", "pct": 50},
        "text/html": "<p>x</p>",
    }
    assert bundle_displays(data) == [
        {"type": "json", "data": {"a": [1, 2]}},
        {"type": "image", "mime": "image/png", "data": PNG},
        {"type": "image", "mime": "image/jpeg", "data": "/9j/4AAQ"},
        {"type": "image", "mime": "image/gif", "data": "R0lGOD"},
        {"type": "image", "mime": "image/webp", "data": "UklGR"},
        {"type": "image", "mime": "image/svg+xml", "data": SVG},
        {"type": "status", "event": {"phase": "fit", "pct": 50}},
    ]


def test_displays_none_for_text_only() -> None:
    assert bundle_displays({"text/plain": "1", "text/html": "<p>1</p>"}) == []


# --- interpret_iopub ---


def test_stream() -> None:
    assert interpret_iopub("stream", {"name": "stdout", "text": "hi\n"}) == [Text("hi\n", "stdout")]
    assert interpret_iopub("stream", {"name": "stderr", "text": "warn"}) == [Text("warn", "stderr")]


def test_execute_result_text_gets_a_newline() -> None:
    events = interpret_iopub("execute_result", {"data": {"text/plain": "2"}, "execution_count": 1})
    assert events == [Text("2\n", "result")]


def test_display_data_and_update() -> None:
    content = {"data": {"text/plain": "shown\n"}, "metadata": {}}
    assert interpret_iopub("display_data", content) == [Text("shown\n", "display")]
    assert interpret_iopub("update_display_data", content) == [Text("shown\n", "display")]


def test_figure_emits_image_and_its_plain_text() -> None:
    data = {"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"}
    assert interpret_iopub("display_data", {"data": data}) == [
        Display({"type": "image", "mime": "image/png", "data": PNG}),
        Text("<Figure size 640x480 with 1 Axes>\n", "display"),
    ]


def test_image_only_bundle_has_no_text() -> None:
    events = interpret_iopub("display_data", {"data": {"image/svg+xml": SVG}})
    assert events == [Display({"type": "image", "mime": "image/svg+xml", "data": SVG})]


def test_json_display_with_text() -> None:
    events = interpret_iopub("execute_result", {"data": {"application/json": [1], "text/plain": "[1]"}})
    assert events == [Display({"type": "json", "data": [1]}), Text("[1]\n", "result")]


@pytest.mark.parametrize("mime", STATUS_MIMES)
def test_status_display_emits_no_text(mime: str) -> None:
    data = {mime: {"step": 3}, "text/plain": "status text"}
    assert interpret_iopub("display_data", {"data": data}) == [
        Display({"type": "status", "event": {"step": 3}})
    ]


def test_dataframe_result_uses_plain_text() -> None:
    df = pd.DataFrame({"a": [1]})
    data = {"text/plain": repr(df), "text/html": df._repr_html_()}
    assert interpret_iopub("execute_result", {"data": data}) == [Text(repr(df) + "\n", "result")]


def test_html_only_display() -> None:
    df = pd.DataFrame({"a": [1]})
    [event] = interpret_iopub("display_data", {"data": {"text/html": df.to_html()}})
    assert isinstance(event, Text) and event.name == "display"
    assert event.text.endswith("|\n") and "| a |" in event.text


def test_empty_text_bundle_emits_nothing() -> None:
    assert interpret_iopub("display_data", {"data": {"text/plain": "\n\n"}}) == []
    assert interpret_iopub("display_data", {"data": {}}) == []


def test_error() -> None:
    content = {
        "ename": "ZeroDivisionError",
        "evalue": "division by zero",
        "traceback": [
            "\x1b[0;31m---------\x1b[0m",
            "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero",
        ],
    }
    info, text = interpret_iopub("error", content)
    assert info == ErrorInfo(
        "ZeroDivisionError", "division by zero", ["---------", "ZeroDivisionError: division by zero"]
    )
    assert text == Text("---------\nZeroDivisionError: division by zero\n", "error")


def test_error_without_traceback() -> None:
    info, text = interpret_iopub("error", {"ename": "KeyError", "evalue": "'x'", "traceback": []})
    assert info == ErrorInfo("KeyError", "'x'", [])
    assert text == Text("KeyError: 'x'\n", "error")


def test_status_and_clear_output() -> None:
    assert interpret_iopub("status", {"execution_state": "busy"}) == [KernelStatus("busy")]
    assert interpret_iopub("status", {"execution_state": "idle"}) == [KernelStatus("idle")]
    assert interpret_iopub("clear_output", {"wait": True}) == [ClearOutput(True)]
    assert interpret_iopub("clear_output", {}) == [ClearOutput(False)]


@pytest.mark.parametrize("msg_type", ["execute_input", "comm_open", "comm_msg", "input_request", "bogus"])
def test_other_messages_give_nothing(msg_type: str) -> None:
    assert interpret_iopub(msg_type, {"code": "1+1", "data": {"text/plain": "x"}}) == []


# --- format_combined_output ---


def cell(
    index: int, output: str, *, title: str | None = None, status: str = "complete", **kw: object
) -> CellOutcome:
    fields: dict = {"exit_code": 0, "has_displays": False, **kw}
    return CellOutcome(index=index, title=title, status=status, output=output, **fields)


def test_single_cell_output() -> None:
    assert format_combined_output([cell(0, "42\n")]) == "42\n"


def test_single_cell_no_output() -> None:
    assert format_combined_output([cell(0, "")]) == "(no output)"


def test_single_cell_only_displays() -> None:
    assert format_combined_output([cell(0, "", has_displays=True)]) == "(no text output)"


def test_single_failed_cell_is_its_output() -> None:
    assert format_combined_output([cell(0, "Traceback\n", status="error", exit_code=1)]) == "Traceback\n"


def test_multi_cell_blocks() -> None:
    cells = [cell(0, "a\n", title="load data"), cell(1, ""), cell(2, "", title="plot", has_displays=True)]
    assert format_combined_output(cells) == (
        "[1/3] load data\na\n\n[2/3]\n(no output)\n\n[3/3] plot\n(no text output)"
    )


def test_multi_cell_failure_stops_the_list() -> None:
    cells = [
        cell(0, "ok\n", title="setup"),
        cell(1, "Traceback...\nValueError: bad\n", title="train", status="error", exit_code=1),
    ]
    assert format_combined_output(cells, total=4) == (
        "[1/4] setup\nok\n\n"
        "[2/4] train\nTraceback...\nValueError: bad\n"
        "Cell 2 failed (exit code 1). Earlier cells succeeded—their state persists. Fix only cell 2."
    )


def test_first_cell_failure_claims_no_earlier_cells() -> None:
    out = format_combined_output([cell(0, "", status="error", exit_code=1)], total=2)
    assert out == "[1/2]\n(no output)\nCell 1 failed (exit code 1). Fix only cell 1."


def test_default_object_repr_gives_way_to_html_or_image() -> None:
    html_bundle = {"text/plain": "<IPython.core.display.HTML object>", "text/html": "<b>bold</b>"}
    assert bundle_text(html_bundle) == "**bold**"
    image_bundle = {"text/plain": "<IPython.core.display.Image object>", "image/png": "iVBORw0KGgo="}
    assert bundle_text(image_bundle) is None
    figure = {"text/plain": "<Figure size 640x480 with 1 Axes>", "image/png": "iVBORw0KGgo="}
    assert bundle_text(figure) == "<Figure size 640x480 with 1 Axes>"
    plain_object = {"text/plain": "<foo.Bar object at 0x7f00aa>"}
    assert bundle_text(plain_object) == "<foo.Bar object at 0x7f00aa>"


# --- objects whose only rich repr is HTML ---


@pytest.mark.parametrize(
    "plain",
    [
        "<__main__.T at 0x7f3a2c1d9e50>",  # IPython's default repr drops the word "object"
        "<pandas.io.formats.style.Styler at 0x7f00aa>",
        "<__main__.T object at 0x7f00aa>",
        "<IPython.core.display.HTML object>",
    ],
)
def test_default_repr_gives_way_to_html(plain: str) -> None:
    assert bundle_text({"text/plain": plain, "text/html": "<b>bold</b> <i>it</i>"}) == "**bold** *it*"


def test_styler_html_becomes_a_table() -> None:
    df = pd.DataFrame({"a": [1, 2]})
    text = bundle_text(
        {"text/plain": "<pandas.io.formats.style.Styler at 0x7f1>", "text/html": df.style.to_html()}
    )
    assert text is not None and "| a |" in text.replace("  ", " ") and "<" not in text


def test_a_real_repr_keeps_precedence_over_html() -> None:
    for plain in ("<Figure size 640x480 with 1 Axes>", "<b>", "   a  b\n0  1  2", "<T at home>"):
        assert bundle_text({"text/plain": plain, "text/html": "<p>html</p>"}) == plain.strip("\n")


# --- bounded rich outputs ---


class Saved:
    """An artifact store stand-in: keeps what is saved, gives ids."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        artifact_id = f"s.{len(self.items)}"
        self.items[artifact_id] = text
        return artifact_id


def test_long_html_is_converted_up_to_the_limit_and_saved_whole() -> None:
    rows = "".join(f"<tr><td>{i}</td><td>row {i}</td></tr>" for i in range(5000))
    html = f"<table><tr><th>n</th><th>name</th></tr>{rows}</table>"
    saved = Saved()
    rich = RichOutput(limits(html_convert_bytes=4096), save=saved)
    text = bundle_text({"text/plain": "<IPython.core.display.HTML object>", "text/html": html}, rich)
    assert text is not None
    body, notice = text.rsplit("\n", 1)
    assert "| 0 | row 0 |" in body and "row 4999" not in body and "<" not in body
    assert len(body) < 4096
    assert re.fullmatch(
        r"\[HTML output of \d+\.\dKB cut: converted its first 4\.0KB\. Full HTML: artifact://s\.0\]", notice
    ), notice
    assert saved.items == {"s.0": html}


def test_cut_html_without_a_store_says_so() -> None:
    text = bundle_text(
        {"text/html": "<p>" + "x" * 5000 + "</p>"}, RichOutput(limits(html_convert_bytes=1024))
    )
    assert text is not None and text.endswith("cut: converted its first 1.0KB.]")


def test_html_within_the_limit_is_converted_whole() -> None:
    rich = RichOutput(limits(html_convert_bytes=1024), save=Saved())
    assert bundle_text({"text/html": "<b>" + "y" * 1000 + "</b>"}, rich) == "**" + "y" * 1000 + "**"


def test_displays_past_the_cell_budget_become_placeholders_with_artifacts() -> None:
    saved = Saved()
    rich = RichOutput(limits(display_bytes=100), save=saved)
    small, big = "A" * 60, "B" * 1000
    value = {"k": "v" * 200}
    assert bundle_displays({"image/png": small}, rich) == [
        {"type": "image", "mime": "image/png", "data": small}
    ]
    assert bundle_displays({"image/png": big, "application/json": value}, rich) == [
        {"type": "image", "mime": "image/png", "bytes": 1000, "omitted": True, "artifact_id": "s.0"},
        {"type": "json", "bytes": len(json.dumps(value)), "omitted": True, "artifact_id": "s.1"},
    ]
    assert saved.items == {"s.0": big, "s.1": json.dumps(value)}
    # the budget is per cell: what is left (40 bytes) still takes a small display
    assert bundle_displays({"image/png": "C" * 40}, rich)[0]["data"] == "C" * 40
    assert bundle_displays({"image/png": "D"}, rich)[0]["omitted"] is True


def test_large_display_without_a_store_has_no_artifact() -> None:
    [display] = bundle_displays({"image/svg+xml": "é" * 100}, RichOutput(limits(display_bytes=10)))
    assert display == {
        "type": "image",
        "mime": "image/svg+xml",
        "bytes": 200,
        "omitted": True,
        "artifact_id": None,
    }


def test_status_displays_are_never_omitted() -> None:
    rich = RichOutput(limits(display_bytes=0))
    event = {"phase": "x" * 100}
    assert bundle_displays({STATUS_MIMES[0]: event}, rich) == [{"type": "status", "event": event}]


def test_big_or_html_displays_need_a_worker_thread() -> None:
    assert needs_worker("display_data", {"data": {"text/html": "<b>x</b>"}})
    assert needs_worker("execute_result", {"data": {"text/plain": "<__main__.T at 0x1>", "text/html": "<b>"}})
    assert needs_worker("display_data", {"data": {"image/png": "A" * 100_000}})
    assert needs_worker("display_data", {"data": {"application/json": list(range(50_000))}})
    assert not needs_worker("execute_result", {"data": {"text/plain": "2"}})
    assert not needs_worker("display_data", {"data": {"image/png": PNG, "text/plain": "<Figure>"}})
    assert not needs_worker("stream", {"name": "stdout", "text": "x" * 1_000_000})


def test_huge_error_is_bounded_in_the_error_object() -> None:
    info = ErrorInfo("ValueError", "v" * 10_000, ["frame 1", "frame 2", "ValueError: " + "v" * 10_000])
    error = bounded_error(info, 1000)
    assert error["ename"] == "ValueError"
    assert error["evalue"] == "v" * 1000 + "[... cut 9000 more characters]"
    assert error["traceback"] == [
        "[... 2 earlier traceback lines cut]",
        "ValueError: " + "v" * 988 + "[... cut 9012 more characters]",
    ]
    small = ErrorInfo("KeyError", "'x'", ["a", "b"])
    assert bounded_error(small, 1000) == {"ename": "KeyError", "evalue": "'x'", "traceback": ["a", "b"]}


def test_long_plain_text_keeps_its_lines() -> None:
    text = "\n\n" + "\n".join(f"line {i}" for i in range(100_000)) + "\n \n"
    assert bundle_text({"text/plain": text}) == text.strip()


def test_cell_frame_is_the_cells_last_frame_in_two_lines() -> None:
    """Where a timed-out cell was: its own last frame (not a library's), location and arrow line only."""
    traceback = [
        "-" * 75,
        "KeyboardInterrupt                         Traceback (most recent call last)",
        "Cell In[1], line 5\n      1 import time\n      4 x=1\n----> 5 f()\n",
        "Cell In[1], line 3, in f()\n      2 def f():\n----> 3     time.sleep(10)\n",
        "File /usr/lib/python3/lib.py:10, in g()\n---> 10 wait()\n",
        "KeyboardInterrupt: ",
    ]
    info = ErrorInfo("KeyboardInterrupt", "", traceback)
    assert cell_frame(info) == "Cell In[1], line 3, in f()\n----> 3     time.sleep(10)"
    long = ErrorInfo("KeyboardInterrupt", "", ["Cell In[2], line 1\n----> 1 " + "x" * 500])
    assert cell_frame(long) == "Cell In[2], line 1\n----> 1 " + "x" * 192 + "…"
    assert cell_frame(ErrorInfo("KeyboardInterrupt", "", ["KeyboardInterrupt: "])) is None  # another kernel


@pytest.mark.parametrize(
    ("msg_type", "content"),
    [
        ("execute_result", {"data": {"text/plain": "2"}, "metadata": {}, "execution_count": 3}),
        ("display_data", {"data": {"image/png": PNG, "text/plain": "<Figure>"}, "metadata": {"a": 1}}),
        ("error", {"ename": "ValueError", "evalue": "bad", "traceback": ["\x1b[31mValueError\x1b[0m: bad"]}),
    ],
)
def test_the_one_reading_stores_what_nbformat_builds_and_answers_from_the_same(msg_type, content):
    """Issue 36.2: a message is read once (read_iopub); the stored output (what nbformat's output_from_msg
    builds, at a few hundred times the cost: decision 0005) and the answer's events derive from it."""
    from nbformat.v4 import output_from_msg

    read = messages.read_iopub(msg_type, content)
    assert read is not None
    expected = output_from_msg({"header": {"msg_type": msg_type}, "content": content})
    assert read.to_nbformat() == expected
    events = messages.interpret_iopub(read, RichOutput(limits()))
    if msg_type == "error":
        assert events[0] == ErrorInfo("ValueError", "bad", ["ValueError: bad"])  # the answer's: no ANSI
        assert read.to_nbformat()["traceback"] == content["traceback"]  # the notebook's: as sent
    else:
        assert events and all(isinstance(e, (Text, Display)) for e in events)
