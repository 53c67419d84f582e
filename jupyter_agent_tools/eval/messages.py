"""Jupyter iopub message content turned into eval events, and the combined text a model reads (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from markdownify import MarkdownConverter

from ..text import strip_ansi

STATUS_MIMES = ("application/x-omp-status", "application/x-xcsh-status")
TEXT_MIMES = ("text/markdown", "text/plain")
DISPLAY_MESSAGES = ("execute_result", "display_data", "update_display_data")


@dataclass(frozen=True)
class Text:
    """Text for the output stream; ``name`` is stdout, stderr, result, display or error."""

    text: str
    name: str


@dataclass(frozen=True)
class Display:
    """A structured output: ``{"type": "json" | "image" | "status", ...}`` (see ``bundle_displays``)."""

    display: dict[str, Any]


@dataclass(frozen=True)
class ErrorInfo:
    """An exception raised by the cell; traceback lines carry no ANSI escapes."""

    ename: str
    evalue: str
    traceback: list[str]


@dataclass(frozen=True)
class KernelStatus:
    """The kernel's ``execution_state``: busy, idle, starting, restarting, dead, ..."""

    state: str


@dataclass(frozen=True)
class ClearOutput:
    """The cell asked to clear its output (``wait``: when the next output arrives)."""

    wait: bool


Event = Text | Display | ErrorInfo | KernelStatus | ClearOutput


def _join(value: Any) -> str | None:
    """A mime value as one string: nbformat may split text into a list of lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return "".join(value)
    return None


def _strip_blank_lines(text: str) -> str:
    """Drop blank lines (whitespace only) before and after the text; keep the first line's indent."""
    lines = text.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


class _Markdown(MarkdownConverter):
    """Markdown for a model to read: ATX headings, no escaping of ``_`` and ``*`` in data."""

    def __init__(self) -> None:
        super().__init__(
            heading_style="ATX",
            escape_underscores=False,
            escape_asterisks=False,
            table_infer_header=True,
            bullets="-",
        )

    def convert_script(self, *args: Any, **kwargs: Any) -> str:
        """Drop scripts (older markdownify versions kept their code)."""
        return ""

    convert_style = convert_script


def html_to_text(html: str) -> str:
    """Readable markdown-ish text for HTML (an HTML table becomes a markdown table)."""
    return _Markdown().convert(html)


# The repr Python gives objects without one of their own: "<IPython.core.display.HTML object>", or as
# IPython prints it, "<__main__.T at 0x7f...>" (IPython's pretty printer drops the word "object").
_DEFAULT_REPR = re.compile(r"^<[\w.]+(?: object(?: at 0x[0-9a-fA-F]+)?| at 0x[0-9a-fA-F]+)>$")


def bundle_text(data: dict[str, Any]) -> str | None:
    """The text of a mime bundle: markdown, else plain, else HTML as markdown; None without a text mime.

    A ``text/plain`` that is only Python's default object repr says nothing a model can use: when the
    bundle also has HTML, the HTML (as markdown) is shown instead; when it has an image or JSON, no text at
    all (that is among the displays).
    """
    html = _join(data.get("text/html"))
    for mime in TEXT_MIMES:
        text = _join(data.get(mime))
        if text is not None:
            if mime == "text/plain" and _DEFAULT_REPR.match(text.strip()):
                if html is not None:
                    break
                if any(m.startswith("image/") or m == "application/json" for m in data):
                    return None  # "<IPython.core.display.Image object>": the data is in displays
            return _strip_blank_lines(text)
    if html is not None:
        return _strip_blank_lines(html_to_text(html))
    return None


def bundle_displays(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Structured outputs of a mime bundle: JSON values, images (base64, SVG as text), status events."""
    displays: list[dict[str, Any]] = []
    for mime, value in data.items():
        if mime == "application/json":
            displays.append({"type": "json", "data": value})
        elif mime.startswith("image/"):
            image = _join(value)
            if image is not None:
                displays.append({"type": "image", "mime": mime, "data": image})
        elif mime in STATUS_MIMES:
            displays.append({"type": "status", "event": value})
    return displays


def interpret_iopub(msg_type: str, content: dict[str, Any]) -> list[Event]:
    """Events for one iopub message (its ``msg_type`` and ``content``); [] for kinds we do not use."""
    if msg_type == "stream":
        return [Text(_join(content.get("text")) or "", str(content.get("name") or "stdout"))]
    if msg_type in DISPLAY_MESSAGES:
        data = content.get("data") or {}
        events: list[Event] = [Display(display) for display in bundle_displays(data)]
        if any(mime in data for mime in STATUS_MIMES):
            return events
        text = bundle_text(data)
        if text:
            name = "result" if msg_type == "execute_result" else "display"
            events.append(Text(text if text.endswith("\n") else text + "\n", name))
        return events
    if msg_type == "error":
        ename = str(content.get("ename") or "")
        evalue = strip_ansi(str(content.get("evalue") or ""))
        traceback = [strip_ansi(line) for line in content.get("traceback") or [] if isinstance(line, str)]
        text = "\n".join(traceback) if traceback else f"{ename}: {evalue}"
        return [ErrorInfo(ename, evalue, traceback), Text(text + "\n", "error")]
    if msg_type == "status":
        return [KernelStatus(str(content.get("execution_state") or ""))]
    if msg_type == "clear_output":
        return [ClearOutput(bool(content.get("wait", False)))]
    return []


@dataclass
class CellOutcome:
    """How one cell of an eval request ended."""

    index: int  # 0-based position in the request
    title: str | None
    status: str  # "complete" | "error" | "cancelled"
    output: str
    exit_code: int
    has_displays: bool


def _cell_text(cell: CellOutcome) -> str:
    """A cell's output, or a placeholder saying why there is none."""
    if cell.output:
        return cell.output
    return "(no text output)" if cell.has_displays else "(no output)"


def format_combined_output(cells: list[CellOutcome], total: int | None = None) -> str:
    """The text a model reads for an eval request.

    ``cells`` are the cells that ran, in order; ``total`` is how many the request had (default: as many
    as ran; cells after a failed one do not run). One cell gives its output alone; more give one block per
    cell headed ``[i/n] title``, blocks separated by a blank line, and a failed cell's block ends with a
    note that names it.
    """
    count = len(cells) if total is None else total
    if count <= 1 and len(cells) == 1:
        return _cell_text(cells[0])
    blocks: list[str] = []
    for cell in cells:
        number = cell.index + 1
        header = f"[{number}/{count}] {cell.title}" if cell.title else f"[{number}/{count}]"
        lines = [header, _cell_text(cell).rstrip("\n")]
        if cell.status == "error":
            lines.append(
                f"Cell {number} failed (exit code {cell.exit_code}). "
                f"Earlier cells succeeded—their state persists. Fix only cell {number}."
            )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
