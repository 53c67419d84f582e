"""Jupyter iopub message content turned into eval events, and the combined text a model reads (pure).

Each iopub message is read once (:func:`read_iopub`: the one dispatch on ``msg_type``) into a small
typed record; the answer's events (:func:`interpret_iopub`) and a notebook run's stored outputs
(:class:`~..notebook.outputs.CellOutputs`) are both derived from that record. nbformat's
``output_from_msg`` does the same reading at 250-450 us a message (it validates), ours at under 1 us:
see docs/decisions/0005-one-iopub-reader.md.

Rich outputs are bounded per cell (:class:`RichOutput`): display data past ``max_display_bytes`` is saved
whole as an artifact (through the injected ``save``) and shown as a placeholder, and only the first
``max_html_convert_bytes`` of an HTML output are converted to text. Converting HTML is slow Python code
(about 200 KB/s): callers run bundles that need it off their event loop (see :func:`needs_worker`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from markdownify import MarkdownConverter

from ..text import TEXT_MIMES, strip_ansi

STATUS_MIMES = ("application/x-omp-status", "application/x-xcsh-status")
DISPLAY_MESSAGES = ("execute_result", "display_data", "update_display_data")


Saver = Callable[[str], str | None]  # saves text as a new artifact: its id, or None if it could not


@dataclass(frozen=True)
class OutputLimits:
    """Bounds on a cell's rich outputs: the values of ``CellExecutor.max_display_bytes`` and
    ``max_html_convert_bytes`` (no defaults here: the traits are the one place they are set)."""

    display_bytes: int  # display data (images, JSON) inlined per cell
    html_convert_bytes: int  # HTML converted to text per output
    images: bool = True  # False: images are not displays (a notebook run answers them from the notebook)


@dataclass
class RichOutput:
    """One cell's rich-output state: its limits, the display bytes it may still inline, where spills go."""

    limits: OutputLimits
    save: Saver | None = None
    inlined: int = 0  # display bytes inlined so far

    def spill(self, text: str) -> str | None:
        """Save ``text`` as an artifact; its id, or None without a store (or on a failed write)."""
        return self.save(text) if self.save is not None else None


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


# -- one reading of an iopub message ---------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """A ``stream`` message: text of stdout or stderr."""

    name: str
    text: str


@dataclass(frozen=True)
class Bundle:
    """An ``execute_result``, ``display_data`` or ``update_display_data`` message."""

    msg_type: str
    data: dict[str, Any]
    metadata: dict[str, Any]
    execution_count: int | None  # an execute_result's
    display_id: str | None  # from ``transient``

    def to_nbformat(self, execution_count: int | None = None) -> dict[str, Any]:
        """The nbformat output (an update is a ``display_data``); ``execution_count``: the cell's, for
        an ``execute_result`` that carries none."""
        update = self.msg_type == "update_display_data"
        output: dict[str, Any] = {
            "output_type": "display_data" if update else self.msg_type,
            "data": dict(self.data),
            "metadata": dict(self.metadata),
        }
        if self.msg_type == "execute_result":
            output["execution_count"] = (
                self.execution_count if self.execution_count is not None else execution_count
            )
        return output


@dataclass(frozen=True)
class Raised:
    """An ``error`` message, as the kernel sent it (ANSI colors included)."""

    ename: str
    evalue: str
    traceback: list[str]

    def to_nbformat(self, execution_count: int | None = None) -> dict[str, Any]:
        return {
            "output_type": "error",
            "ename": self.ename,
            "evalue": self.evalue,
            "traceback": list(self.traceback),
        }


@dataclass(frozen=True)
class Cleared:
    """A ``clear_output`` message."""

    wait: bool


@dataclass(frozen=True)
class Input:
    """An ``execute_input`` message: the execution count the kernel gave the cell."""

    execution_count: int | None


@dataclass(frozen=True)
class Status:
    """A ``status`` message."""

    state: str


Iopub = Stream | Bundle | Raised | Cleared | Input | Status


def read_iopub(msg_type: str, content: dict[str, Any]) -> Iopub | None:
    """One iopub message (its ``msg_type`` and ``content``) as a record; None for kinds nobody uses."""
    if msg_type == "stream":
        return Stream(str(content.get("name") or "stdout"), _join(content.get("text")) or "")
    if msg_type in DISPLAY_MESSAGES:
        count, data, metadata = (content.get(k) for k in ("execution_count", "data", "metadata"))
        transient = content.get("transient")
        display_id = transient.get("display_id") if isinstance(transient, dict) else None
        return Bundle(
            msg_type,
            data if isinstance(data, dict) else {},  # the message's own: read, never changed
            metadata if isinstance(metadata, dict) else {},
            count if isinstance(count, int) else None,
            display_id if isinstance(display_id, str) else None,
        )
    if msg_type == "error":
        return Raised(
            str(content.get("ename") or ""),
            str(content.get("evalue") or ""),
            [line for line in content.get("traceback") or [] if isinstance(line, str)],
        )
    if msg_type == "clear_output":
        return Cleared(bool(content.get("wait", False)))
    if msg_type == "execute_input":
        count = content.get("execution_count")
        return Input(count if isinstance(count, int) else None)
    if msg_type == "status":
        return Status(str(content.get("execution_state") or ""))
    return None


def _join(value: Any) -> str | None:
    """A mime value as one string: nbformat may split text into a list of lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return "".join(value)
    return None


# Line boundaries of str.splitlines() other than "\n": text without them is handled without splitting.
_OTHER_LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_NON_SPACE = re.compile(r"\S")


def _strip_blank_lines(text: str) -> str:
    """Drop blank lines (whitespace only) before and after the text; keep the first line's indent.

    Lines end as ``str.splitlines`` ends them and come back joined with ``\\n``.
    """
    if not _OTHER_LINE_BREAKS.search(text):  # one slice, not a list of every line (a long text has many)
        first = _NON_SPACE.search(text)
        if first is None:
            return ""
        end = len(text)
        while text[end - 1].isspace():
            end -= 1
        start = text.rfind("\n", 0, first.start()) + 1
        stop = text.find("\n", end)
        return text[start : stop if stop != -1 else len(text)]
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


def _size(n: int) -> str:
    return f"{n / 1024:.1f}KB" if n < 1024 * 1024 else f"{n / (1024 * 1024):.1f}MB"


def bounded_html_to_text(html: str, rich: RichOutput) -> str:
    """:func:`html_to_text` of at most the first ``html_convert_bytes`` of ``html``; past them a notice
    says it was cut and where the whole HTML went (an artifact)."""
    limit = rich.limits.html_convert_bytes
    if len(html) * 4 <= limit:  # fast path: cannot be over the limit even in 4-byte characters
        return _strip_blank_lines(html_to_text(html))
    data = html.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return _strip_blank_lines(html_to_text(html))
    head = data[:limit].decode("utf-8", "ignore")
    tag = head.rfind("<")
    if tag > 0:
        head = head[:tag]  # do not convert half a tag
    artifact_id = rich.spill(html)
    where = f" Full HTML: artifact://{artifact_id}" if artifact_id else ""
    notice = f"[HTML output of {_size(len(data))} cut: converted its first {_size(len(head))}.{where}]"
    return f"{_strip_blank_lines(html_to_text(head))}\n{notice}"


# The repr Python gives objects without one of their own: "<IPython.core.display.HTML object>", or as
# IPython prints it, "<__main__.T at 0x7f...>" (IPython's pretty printer drops the word "object").
_DEFAULT_REPR = re.compile(r"^<[\w.]+(?: object(?: at 0x[0-9a-fA-F]+)?| at 0x[0-9a-fA-F]+)>$")


def _text_source(data: dict[str, Any]) -> tuple[str, str] | None:
    """Which text a bundle shows, as (mime, value): markdown, else plain, else HTML; None for none.

    A ``text/plain`` that is only Python's default object repr says nothing a model can use: when the
    bundle also has HTML, the HTML is shown instead; when it has an image or JSON, no text at all (that
    is among the displays).
    """
    html = _join(data.get("text/html"))
    for mime in TEXT_MIMES:
        text = _join(data.get(mime))
        if text is not None:
            if mime == "text/plain" and len(text) < 1024 and _DEFAULT_REPR.match(text.strip()):
                if html is not None:
                    break
                if any(m.startswith("image/") or m == "application/json" for m in data):
                    return None  # "<IPython.core.display.Image object>": the data is in displays
            return mime, text
    if html is not None:
        return "text/html", html
    return None


def bundle_text(data: dict[str, Any], rich: RichOutput) -> str | None:
    """The text of a mime bundle: markdown, else plain, else HTML as markdown; None without a text mime."""
    source = _text_source(data)
    if source is None:
        return None
    mime, text = source
    if mime == "text/html":
        return bounded_html_to_text(text, rich)
    return _strip_blank_lines(text)


def _json_size(value: Any, limit: int) -> int:
    """About the length of ``value`` as JSON text (a lower bound); counting stops once past ``limit``."""
    size, stack = 0, [value]
    while stack and size <= limit:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item) + 2
        elif isinstance(item, dict):
            size += 2 + 4 * len(item)
            if size <= limit:
                stack.extend(item.keys())
                stack.extend(item.values())
        elif isinstance(item, list | tuple):
            size += 2 + len(item)
            if size <= limit:
                stack.extend(item)
        else:
            size += len(repr(item))
    return size


def _display(rich: RichOutput, display: dict[str, Any], value: Any, size: int) -> dict[str, Any]:
    """``display`` with its ``data`` when the cell still has room for ``size`` bytes, else a placeholder
    with the data saved whole as an artifact."""
    limit = rich.limits.display_bytes
    if rich.inlined + size <= limit:
        rich.inlined += size
        return {**display, "data": value}
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return {
        **display,
        "bytes": len(text) if text.isascii() else len(text.encode("utf-8", "replace")),
        "omitted": True,
        "artifact_id": rich.spill(text),
    }


def bundle_displays(data: dict[str, Any], rich: RichOutput) -> list[dict[str, Any]]:
    """Structured outputs of a mime bundle: JSON values, images (base64, SVG as text), status events.

    Display data a cell has no room left for (``max_display_bytes`` per cell) becomes a placeholder
    ``{"type", ["mime",] "bytes", "omitted": true, "artifact_id"}``; the artifact holds the data as it
    would have been sent (base64 text of a binary image, JSON text of a JSON value).
    """
    room = rich.limits.display_bytes - rich.inlined
    displays: list[dict[str, Any]] = []
    for mime, value in data.items():
        if mime == "application/json":
            displays.append(_display(rich, {"type": "json"}, value, _json_size(value, room)))
        elif mime.startswith("image/"):
            if not rich.limits.images:
                continue
            image = _join(value)
            if image is not None:
                size = len(image) if image.isascii() else len(image.encode("utf-8", "replace"))
                displays.append(_display(rich, {"type": "image", "mime": mime}, image, size))
        elif mime in STATUS_MIMES:
            displays.append({"type": "status", "event": value})
    return displays


# Bundles with this much data, or HTML to convert, are worth a worker thread (see needs_worker).
_WORKER_BYTES = 64 * 1024


def needs_worker(read: Iopub, *, storing: bool = False) -> bool:
    """Whether interpreting this message may take long enough to block an event loop: a display whose
    text comes from HTML, or whose data is large (to measure, and maybe to save as an artifact); when
    the outputs are also ``storing`` (a notebook run), a long stream chunk or an error too."""
    if storing:
        if isinstance(read, Raised):
            return True
        if isinstance(read, Stream):
            return len(read.text) > _WORKER_BYTES
    if not isinstance(read, Bundle):
        return False
    data = read.data
    source = _text_source(data)
    if source is not None and source[0] == "text/html":
        return True
    return _json_size(data, _WORKER_BYTES) > _WORKER_BYTES


def bounded_error(info: ErrorInfo, max_chars: int) -> dict[str, Any]:
    """An error as the answer's ``error`` object, within about ``max_chars``: a longer ``evalue`` keeps
    its start, a longer traceback its last lines (the whole traceback is in the cell's output text)."""
    evalue = info.evalue
    if len(evalue) > max_chars:
        evalue = f"{evalue[:max_chars]}[... cut {len(evalue) - max_chars} more characters]"
    traceback: list[str] = []
    room = max_chars
    for line in reversed(info.traceback):
        if len(line) > room:
            if not traceback:  # the last line (the exception) is kept, cut
                traceback.append(f"{line[:room]}[... cut {len(line) - room} more characters]")
            break
        traceback.append(line)
        room -= len(line)
    dropped = len(info.traceback) - len(traceback)
    if dropped:
        traceback.append(f"[... {dropped} earlier traceback lines cut]")
    traceback.reverse()
    return {"ename": info.ename, "evalue": evalue, "traceback": traceback}


FRAME_LINE = 200  # characters kept of each line of a cell_frame
_ARROW = re.compile(r"\s*-+>")  # IPython marks a frame's current line "---->" (older: "--->")


def cell_frame(info: ErrorInfo) -> str | None:
    """Where the cell's own code was when ``info`` stopped it: the last frame of the cell in an IPython
    traceback, as its location line and its ``---->`` line (``Cell In[1], line 3, in f()`` /
    ``----> 3     time.sleep(10)``); None when the traceback has no such frame (another kernel)."""
    for entry in reversed(info.traceback):
        lines = entry.strip("\n").split("\n")
        if lines[0].startswith("Cell In[") or "<ipython-input-" in lines[0]:
            kept = [lines[0], *(line for line in lines[1:] if _ARROW.match(line))][:2]
            return "\n".join(line if len(line) <= FRAME_LINE else line[:FRAME_LINE] + "…" for line in kept)
    return None


def interpret_iopub(read: Iopub | None, rich: RichOutput) -> list[Event]:
    """The answer's events for one message read by :func:`read_iopub`; [] for kinds it does not show.
    ``rich`` is the cell's rich-output state."""
    if isinstance(read, Stream):
        return [Text(read.text, read.name)]
    if isinstance(read, Bundle):
        data = read.data
        events: list[Event] = [Display(display) for display in bundle_displays(data, rich)]
        if any(mime in data for mime in STATUS_MIMES):
            return events
        text = bundle_text(data, rich)
        if text:
            name = "result" if read.msg_type == "execute_result" else "display"
            events.append(Text(text if text.endswith("\n") else text + "\n", name))
        return events
    if isinstance(read, Raised):
        evalue = strip_ansi(read.evalue)
        traceback = [strip_ansi(line) for line in read.traceback]
        text = "\n".join(traceback) if traceback else f"{read.ename}: {evalue}"
        return [ErrorInfo(read.ename, evalue, traceback), Text(text + "\n", "error")]
    if isinstance(read, Status):
        return [KernelStatus(read.state)]
    if isinstance(read, Cleared):
        return [ClearOutput(read.wait)]
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
    # How the text names the cell when it fails: a notebook run says "cell 2 (id plot)", the cell's index
    # in the notebook and its id; None: "cell <its 1-based place in the request>", as eval numbers cells.
    name: str | None = None
    kernel_died: bool = False  # the kernel died (or was restarted) while this cell ran


def _cell_text(cell: CellOutcome) -> str:
    """A cell's output, or a placeholder saying why there is none."""
    if cell.output:
        return cell.output
    if cell.kernel_died:
        return "(no output: the kernel died while running this cell)"
    return "(no text output)" if cell.has_displays else "(no output)"


def answer_text(cells: list[CellOutcome], total: int, notices: list[str], error: str | None = None) -> str:
    """An answer's ``output``: its notices, then :func:`format_combined_output` of the cells that ran,
    then the ``error`` that ended it (eval's and a notebook run's)."""
    output = format_combined_output(cells, total) if cells else ""
    if error:
        output = f"{output}\n{error}".strip("\n")
    return "\n".join([*notices, output]) if output else "\n".join(notices)


def format_combined_output(cells: list[CellOutcome], total: int | None = None) -> str:
    """The text a model reads for an eval request.

    ``cells`` are the cells that ran, in order; ``total`` is how many the request had (default: as many
    as ran; cells after a failed one do not run). One cell of an eval gives its output alone; more (or any
    cell with a ``name``, a notebook's) give one block per cell headed ``[i/n] title``, blocks separated by
    a blank line, and a failed cell's block ends with a note that names it.
    """
    count = len(cells) if total is None else total
    if count <= 1 and len(cells) == 1 and cells[0].name is None:
        return _cell_text(cells[0])
    blocks: list[str] = []
    for cell in cells:
        number = cell.index + 1
        header = f"[{number}/{count}] {cell.title}" if cell.title else f"[{number}/{count}]"
        lines = [header, _cell_text(cell).rstrip("\n")]
        if cell.status == "error":
            name = cell.name or f"cell {number}"
            what = f"{name[0].upper()}{name[1:]} failed (exit code {cell.exit_code})."
            if cell.kernel_died:
                earlier = " Earlier cells ran, but their state went with the kernel." if number > 1 else ""
                lines.append(f"{what} The kernel died while running it.{earlier} Fix only {name}.")
            else:
                earlier = "Earlier cells succeeded—their state persists. " if number > 1 else ""
                lines.append(f"{what} {earlier}Fix only {name}.")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
