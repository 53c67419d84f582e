"""Plain text for agents' shells and pipes: no colour, no control codes, the API's own words."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ...client import AgentAPIError, EvalEvent
from . import NotebookCall, RunPlan, approval_line, stream_failure
from .images import Saver, describe


def with_newline(text: str) -> str:
    """The text as it is, ended by a newline if it is not empty and has none (so a prompt starts on its
    own line)."""
    return text if not text or text.endswith("\n") else text + "\n"


# The server's notices of text kept elsewhere ("[Showing lines ... Full: artifact://<id>]", "[HTML output of
# ... Full HTML: artifact://<id>]"), each a line of its own.
_ARTIFACT_NOTICE = re.compile(
    r"^(\[(?:Showing|HTML output of) [^\n]*?Full(?: HTML)?: )artifact://([\w.-]+)\]$", re.MULTILINE
)


def artifact_commands(text: str) -> str:
    """``text`` with each notice's ``artifact://<id>`` written as the command that prints it."""
    return _ARTIFACT_NOTICE.sub(r"\1jupyter agent artifact \2]", text)


def _write(text: str) -> None:
    # UTF-8 bytes, whatever encoding the pipe's locale would pick.
    sys.stdout.flush()
    sys.stdout.buffer.write(text.encode("utf-8", "replace"))
    sys.stdout.buffer.flush()


def cell_header(cell: dict[str, Any]) -> str:
    header = f"[{cell.get('index')}] {cell.get('cell_type')}"
    if cell.get("id"):
        header += f" id={cell['id']}"
    if cell.get("execution_count") is not None:
        header += f" execution_count={cell['execution_count']}"
    return header


def output_lines(output: dict[str, Any]) -> list[str]:
    """One output summary of a notebook read as text lines."""
    kind = output.get("output_type")
    lines: list[str] = []
    if kind == "stream":
        lines.append(str(output.get("text") or "").rstrip("\n"))
    elif kind == "error":
        lines.append(str(output.get("traceback") or f"{output.get('ename')}: {output.get('evalue')}"))
    elif kind in ("execute_result", "display_data"):
        if output.get("text") is not None:
            lines.append(str(output["text"]).rstrip("\n"))
        for item in output.get("data") or []:
            size = item.get("bytes")
            lines.append(
                f"[{item.get('mime')} {size} bytes]" if size is not None else f"[{item.get('mime')}]"
            )
    else:
        lines.append(f"[{kind}]")
    return lines


def notebook_text(answer: dict[str, Any], cells: list[dict[str, Any]], outputs: bool) -> str:
    """A notebook read as text: a header with the hash, then each cell's header line and source."""
    total = answer.get("cell_count", len(answer.get("cells") or []))
    parts = [f"{answer.get('path')}: {total} cell{'' if total == 1 else 's'}, hash {answer.get('hash')}"]
    for cell in cells:
        block = [cell_header(cell)]
        if cell.get("source"):
            block.append(str(cell["source"]))
        if outputs and cell.get("cell_type") == "code":
            summaries = cell.get("outputs") or []
            block.append(f"[{cell.get('index')}] outputs:" + ("" if summaries else " none"))
            for output in summaries:
                block.extend(output_lines(output))
        parts.append("\n".join(block))
    return "\n\n".join(parts) + "\n"


def change_text(answer: dict[str, Any]) -> str:
    """A notebook change as text: the route's message, then the cell's source (a delete: the removed one)."""
    source = str((answer.get("details") or {}).get("cellSource") or "")
    return with_newline(str(answer.get("message") or "")) + with_newline(source)


SESSION_COLUMNS = (
    ("NAME", "name"),
    ("MODE", "mode"),
    ("KERNEL", "kernel_id"),
    ("BUSY", "busy"),
    ("QUEUE", "queue_depth"),
    ("EXECUTIONS", "executions"),
    ("RESTARTS", "restarts"),
    ("LAST USED", "last_used"),
    ("LAST OUTPUT", "last_output_at"),
    ("OWNER", "owner"),
    ("CWD", "cwd"),
)


def session_cell(session: dict[str, Any], key: str) -> str:
    """One column of a session row as text (``-`` for nothing, ``.`` for the root as cwd)."""
    value = session.get(key)
    if key == "cwd" and value == "":
        return "."
    return _cell(value)


def pool_line(answer: dict[str, Any]) -> str:
    """The warm kernel pool in one line, or "" when the server keeps none."""
    pool = answer.get("pool") or {}
    if not pool.get("size"):
        return ""
    return (
        f"Warm kernels for per-call evals: {pool.get('ready', 0)} ready, {pool.get('starting', 0)} starting "
        f"(pool of {pool['size']}, {pool.get('taken', 0)} taken)\n"
    )


def notebook_kernel_lines(answer: dict[str, Any]) -> str:
    """One line per notebook that has a kernel (JupyterLab's too), or ""."""
    return "".join(
        f"Notebook {k['path']}: kernel {k.get('kernel_name') or '-'} ({k['kernel_id']}), {k['state']}"
        + (", a person is connected" if k.get("person_connected") else "")
        + "\n"
        for k in answer.get("notebook_kernels") or []
    )


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "-" if value is None else str(value)


def sessions_text(answer: dict[str, Any]) -> str:
    """The session list as aligned columns."""
    sessions = answer.get("sessions") or []
    if not sessions:
        return "No sessions.\n" + notebook_kernel_lines(answer) + pool_line(answer)
    rows = [[title for title, _ in SESSION_COLUMNS]]
    rows += [[session_cell(s, key) for _, key in SESSION_COLUMNS] for s in sessions]
    widths = [max(len(row[i]) for row in rows) for i in range(len(SESSION_COLUMNS))]
    lines = ("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows)
    return "".join(line + "\n" for line in lines) + notebook_kernel_lines(answer) + pool_line(answer)


def stream_result(
    events: Iterator[EvalEvent], plan: RunPlan, note: Callable[[str], None], show: Callable[[EvalEvent], None]
) -> dict[str, Any]:
    """The run loop of the plain and machine renderers: each event to ``show``, each image display saved
    (``--save-images``, noted), an ``error`` event raised; the answer of the ``result`` event returned."""
    saver = Saver(plan.save_images)
    result: dict[str, Any] | None = None
    for event in events:
        show(event)
        if event["type"] == "display":
            saved = saver(event["index"], event["display"])
            if saved is not None:
                note(describe(event["display"], saved))
        elif event["type"] == "error":
            raise stream_failure(event)
        elif event["type"] == "result":
            result = dict(event["result"])
    if result is None:
        raise AgentAPIError(None, "the event stream ended before its result", "truncated")
    return result


class PlainRenderer:
    """Plain text on stdout; errors and notes on stderr."""

    def run(self, events: Iterator[EvalEvent], plan: RunPlan) -> dict[str, Any]:
        result = stream_result(events, plan, self.note, self._approval)
        _write(with_newline(artifact_commands(str(result.get("output") or ""))))
        return result

    def _approval(self, event: EvalEvent) -> None:
        if event["type"] == "approval":
            self.note(approval_line(event))

    def notebook(
        self, answer: dict[str, Any], cells: list[dict[str, Any]], outputs: bool, expand: bool
    ) -> None:
        _write(notebook_text(answer, cells, outputs))

    def notebook_change(self, call: NotebookCall, answer: dict[str, Any], expand: bool) -> None:
        _write(change_text(answer))

    def sessions(self, answer: dict[str, Any]) -> None:
        _write(sessions_text(answer))

    def done(self, message: str, answer: dict[str, Any]) -> None:
        _write(with_newline(message))

    def listing(self, text: str, answer: dict[str, Any]) -> None:
        _write(with_newline(text))

    def text(self, pieces: Iterable[str]) -> None:
        for piece in pieces:
            _write(piece)

    def error(self, message: str, call: NotebookCall | None = None) -> None:
        print(f"Error: {message}", file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        print(f"jupyter agent: {message}", file=sys.stderr, flush=True)
