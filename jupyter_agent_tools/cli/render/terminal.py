"""Rendered for a person at a terminal (rich): live cell status, streamed text, displays and errors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.padding import Padding
from rich.panel import Panel
from rich.spinner import Spinner
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ...client import AgentAPIError, EvalEvent
from ...text import human_size
from . import NotebookCall, RunPlan, approval_line, stream_failure
from .images import Saver, describe
from .plain import SESSION_COLUMNS, PlainRenderer, output_lines, pool_line, session_cell

COLLAPSED_LINES = 10  # source lines shown before "… n more lines" (--expand shows all)
TEXT_CAP = 200_000  # characters of a cell's text kept while it runs (the earliest are dropped)
SCREEN_RESERVE = 8  # terminal rows a cell's final block leaves for its status line, warnings and summary
MIN_TEXT_ROWS = 10  # rows of text a cell's final block shows on however small a terminal
TAIL_CHARS = 8_000  # characters of the running cell's text kept for the live view
LIVE_TAIL_LINES = 12  # lines of the running cell shown under its status line
JSON_ITEMS = 50  # children shown per JSON level
JSON_DEPTH = 8
STYLES = {
    "pending": ("○", "dim"),
    "running": ("●", "cyan"),
    "complete": ("✓", "green"),
    "error": ("✗", "red"),
    "cancelled": ("■", "yellow"),
    "not run": ("·", "dim"),
}
LEXERS = {"code": "python", "markdown": "markdown"}


def seconds(value: float) -> str:
    if value < 60:
        return f"{value:.1f}s"
    minutes, rest = divmod(int(value), 60)
    return f"{minutes}m{rest:02d}s"


def json_tree(data: Any, label: str = "JSON") -> Tree:
    """A JSON value as a tree (at most ``JSON_ITEMS`` children per level, ``JSON_DEPTH`` levels)."""
    tree = Tree(Text(label, style="bold"))

    def scalar(value: Any) -> Text:
        return Text(
            json.dumps(value, ensure_ascii=False), style="cyan" if isinstance(value, str) else "magenta"
        )

    def add(node: Tree, value: Any, depth: int) -> None:
        items: list[tuple[str, Any]]
        if isinstance(value, dict):
            items = [(str(k), v) for k, v in value.items()]
        else:
            items = [(f"[{i}]", v) for i, v in enumerate(value)]
        for key, child in items[:JSON_ITEMS]:
            if isinstance(child, (dict, list)) and child:
                if depth >= JSON_DEPTH:
                    node.add(Text.assemble((key, "bold"), (" …", "dim")))
                else:
                    add(node.add(Text(key, style="bold")), child, depth + 1)
            else:
                node.add(Text.assemble((key, "bold"), ": ", scalar(child)))
        if len(items) > JSON_ITEMS:
            node.add(Text(f"… {len(items) - JSON_ITEMS} more", style="dim"))

    if isinstance(data, (dict, list)) and data:
        add(tree, data, 1)
    else:
        tree.add(scalar(data))
    return tree


def screen_tail(text: str, rows: int, width: int) -> tuple[str, int, int]:
    """The end of ``text`` that fills at most ``rows`` rows of ``width`` columns: (that end, how many of
    the text's lines it leaves out, rows it fills). A line too long for the rows left keeps its end."""
    lines = text.split("\n")
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        if used >= rows:
            break
        need = max(1, -(-cell_len(line) // width))
        if used + need > rows:
            keep = (rows - used) * width - 1
            kept.append("…" + line[-keep:] if keep > 0 else "…")
            used = rows
            break
        kept.append(line)
        used += need
    kept.reverse()
    return "\n".join(kept), len(lines) - len(kept), used


def status_line(event: Any) -> str:
    """A status display's event on one line: ``key: value · ...`` for an object."""
    if isinstance(event, dict):
        return " · ".join(
            f"{k}: {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}" for k, v in event.items()
        )
    return json.dumps(event, ensure_ascii=False)


class _Cell:
    """What the terminal knows about one cell of a run."""

    def __init__(self, index: int, title: str | None):
        self.index = index
        self.title = title
        self.status = "pending"
        self.started: float | None = None
        self.duration: float | None = None
        self.parts: list[tuple[str, Any]] = []  # ("text", str) or ("display", (display, saved path))
        self.kept = 0
        self.dropped_lines = 0
        self.traceback = ""
        self.tail = ""
        self.spinner = Spinner("dots", style="cyan")

    def label(self, total: int | None) -> str:
        number = f"[{self.index + 1}/{total}]" if total else f"[cell {self.index}]"
        return f"{number} {self.title}" if self.title else number

    def add_text(self, text: str) -> None:
        self.tail = (self.tail + text)[-TAIL_CHARS:]
        if self.parts and self.parts[-1][0] == "text":
            self.parts[-1] = ("text", self.parts[-1][1] + text)
        else:
            self.parts.append(("text", text))
        self.kept += len(text)
        while self.kept > TEXT_CAP:  # drop the earliest text, counting its lines
            first = next(i for i, (kind, _) in enumerate(self.parts) if kind == "text")
            value: str = self.parts[first][1]
            cut = min(len(value), self.kept - TEXT_CAP)
            cut = value.find("\n", cut - 1) + 1 or len(value)  # whole lines
            self.dropped_lines += value[:cut].count("\n")
            self.kept -= cut
            if cut >= len(value):
                del self.parts[first]
            else:
                self.parts[first] = ("text", value[cut:])

    def elapsed(self) -> float:
        if self.duration is not None:
            return self.duration
        return time.monotonic() - self.started if self.started is not None else 0.0

    def line(self, total: int | None, symbol: bool = True) -> Text:
        mark, style = STYLES.get(self.status, ("?", ""))
        text = Text.assemble((f"{mark} " if symbol else "", style), (self.label(total), "bold"), "  ")
        text.append(self.status, style)
        if self.started is not None:
            text.append(f"  {seconds(self.elapsed())}", style="dim")
        return text


class _Run:
    """A run's state: the event loop changes it and the live area draws it, always under ``lock``."""

    def __init__(self, plan: RunPlan, console: Console):
        self.console = console
        self.plan = plan
        self.total = len(plan.titles) if plan.titles is not None else None
        self.cells: dict[int, _Cell] = {}
        for i, title in enumerate(plan.titles or []):
            self.cells[i] = _Cell(i, title)
        self.started = self.monotonic(plan.started)
        self.waiting = Spinner("dots", style="cyan")
        self.statuses: list[tuple[_Cell, Any]] = []

    @staticmethod
    def monotonic(wall: float | None) -> float:
        """The monotonic clock's reading at wall-clock time ``wall`` (now for None)."""
        now = time.monotonic()
        return now if wall is None else now - max(0.0, time.time() - wall)

    def cell(self, index: int, title: str | None = None) -> _Cell:
        if index not in self.cells:
            self.cells[index] = _Cell(index, title)
        return self.cells[index]

    def __rich__(self) -> RenderableType:
        rows: list[RenderableType] = []
        cells = [self.cells[i] for i in sorted(self.cells)]
        if not any(c.started is not None for c in cells):
            self.waiting.update(text=Text(f"starting  {seconds(time.monotonic() - self.started)}", "dim"))
            rows.append(self.waiting)
        pending = [c for c in cells if c.status == "pending"]
        for cell in cells:
            if cell.status != "running":
                continue
            cell.spinner.update(text=cell.line(self.total, symbol=False))
            rows.append(cell.spinner)
            room = max(1, min(LIVE_TAIL_LINES, self.console.height - len(pending) - 4))
            for line in cell.tail.rstrip("\n").split("\n")[-room:] if cell.tail else []:
                rows.append(Text("  " + line, overflow="ellipsis", no_wrap=True))
        rows.extend(c.line(self.total) for c in pending)
        return Group(*rows)


class _Ticker:
    """Redraws the live area a few times a second, under the lock that also guards every print.

    rich's own auto-refresh thread computes where to move the cursor before it draws, outside any lock
    shared with prints from other threads; a print racing it erases a line that was already printed.
    """

    def __init__(self, live: Live, lock: threading.Lock, interval: float = 0.125):
        self.live, self.lock, self.interval = live, lock, interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="jupyter-agent-live", daemon=True)

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval):
            with self.lock:
                if not self.stopped.is_set():
                    self.live.refresh()

    def __enter__(self) -> _Ticker:
        self.live.start(refresh=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        with self.lock:
            self.live.stop()
        self.thread.join(timeout=1)


class TerminalRenderer:
    """Colours, live status and syntax highlighting on stdout; errors and notes on stderr."""

    def __init__(self, console: Console | None = None, errors: Console | None = None):
        self.console = console or Console(highlight=False)
        self.errors = errors or Console(stderr=True, highlight=False)
        self._plain = PlainRenderer()

    # -- runs ------------------------------------------------------------------------------------------

    def _display(self, display: dict[str, Any], saved: Path | None) -> RenderableType:
        kind = display.get("type")
        if kind == "json":
            return json_tree(display.get("data"))
        if kind == "image":
            return Text(describe(display, saved), style="cyan")
        return Text(f"[{kind} display]", style="dim")

    def _block(self, cell: _Cell, total: int | None) -> RenderableType:
        """A cell that ended: its status line, the end of its text that fits a screen, its displays and
        its error."""
        room = max(MIN_TEXT_ROWS, self.console.height - SCREEN_RESERVE)
        width = max(1, self.console.width - 2)
        hidden = cell.dropped_lines
        body: list[RenderableType] = []
        for kind, value in reversed(cell.parts):
            if kind != "text":
                body.append(Padding(self._display(*value), (0, 0, 0, 2)))
                continue
            text = value[:-1] if value.endswith("\n") else value
            if room <= 0:
                hidden += text.count("\n") + 1
                continue
            shown, left_out, used = screen_tail(text, room, width)
            hidden, room = hidden + left_out, room - used
            body.append(Padding(Text(shown), (0, 0, 0, 2)))
        rows: list[RenderableType] = [cell.line(total)]
        if hidden:
            rows.append(Text(f"  … {hidden} earlier line{'s' if hidden > 1 else ''} not shown", style="dim"))
        rows.extend(reversed(body))
        if cell.traceback:
            rows.append(
                Padding(
                    Panel(
                        Text(cell.traceback.rstrip("\n")),
                        border_style="red",
                        title="error",
                        title_align="left",
                    ),
                    (0, 0, 0, 2),
                )
            )
        return Group(*rows)

    def run(self, events: Iterator[EvalEvent], plan: RunPlan) -> dict[str, Any]:
        state = _Run(plan, self.console)
        saver = Saver(plan.save_images)
        result: dict[str, Any] | None = None
        lock = threading.Lock()
        live = Live(state, console=self.console, auto_refresh=False, transient=True, redirect_stdout=False)
        try:
            with _Ticker(live, lock):
                for event in events:
                    with lock:
                        result = self._event(event, state, saver, live) or result
        except KeyboardInterrupt:
            for cell in state.cells.values():
                if cell.status == "running":
                    if not plan.watching:  # a watched run goes on: its cell is still running
                        cell.status, cell.duration = "cancelled", cell.elapsed()
                    self.console.print(self._block(cell, state.total))
            raise
        if result is None:
            raise AgentAPIError(None, "the event stream ended before its result", "truncated")
        self._finish(state, result)
        return result

    def _event(self, event: EvalEvent, state: _Run, saver: Saver, live: Live) -> dict[str, Any] | None:
        """Apply one event to the state; print what is final (a cell that ended, a restart)."""
        if event["type"] == "result":
            return dict(event["result"])
        if event["type"] == "error":
            raise stream_failure(event)
        if event["type"] == "cell_start":
            index = event["index"]
            cell = state.cell(index, event["title"])
            cell.status, cell.started = "running", state.monotonic(state.plan.cells_started.get(index))
        elif event["type"] == "chunk":
            cell = state.cell(event["index"])
            if event["name"] == "error":
                cell.traceback += event["text"]
            else:
                cell.add_text(event["text"])
        elif event["type"] == "display":
            index, display = event["index"], event["display"]
            cell = state.cell(index)
            if display.get("type") == "status":
                state.statuses.append((cell, display.get("event")))
            else:
                cell.parts.append(("display", (display, saver(index, display))))
        elif event["type"] == "cell_end":
            cell = state.cell(event["index"])
            cell.status = event["status"]
            cell.duration = event["duration_ms"] / 1000
            if cell.started is None:
                cell.started = time.monotonic() - cell.duration
            live.console.print(self._block(cell, state.total))
        elif event["type"] == "restart":
            live.console.print(Text(f"↻ {event['message'] or 'the kernel was restarted'}", "yellow"))
        elif event["type"] == "approval":
            live.console.print(
                Text(approval_line(event), "yellow" if event["state"] == "pending" else "green")
            )
        return None

    def _finish(self, state: _Run, result: dict[str, Any]) -> None:
        console = self.console
        for ran in result.get("cells") or []:  # a notebook run names the cells after a failure: not_run
            if ran.get("status") == "not_run":
                state.cell(int(ran.get("index") or 0), ran.get("title"))
        for cell in (state.cells[i] for i in sorted(state.cells)):
            if cell.status == "pending":
                cell.status = "not run"
                console.print(cell.line(state.total))
        if state.statuses:
            console.print(Text("Status", style="bold"))
            for cell, event in state.statuses:
                console.print(Text.assemble("  ", (cell.label(state.total), "dim"), "  ", status_line(event)))
        labels = {c.index: c.label(state.total) for c in state.cells.values()}
        for cell in result.get("cells") or []:
            if not cell.get("truncated"):
                continue
            label = labels.get(int(cell.get("index") or 0), f"[{cell.get('index')}]")
            console.print(
                Text.assemble(
                    ("⚠ ", "yellow"),
                    (f"{label}: output truncated", "yellow"),
                    f" — the answer keeps the last {cell.get('output_lines')} of {cell.get('total_lines')} "
                    f"lines ({human_size(int(cell.get('output_bytes') or 0))} of "
                    f"{human_size(int(cell.get('total_bytes') or 0))})",
                )
            )
            # soft_wrap: the command is never broken across lines, so it can be copied whole
            command = f"jupyter agent artifact {cell.get('artifact_id')}"
            console.print(Text.assemble("  full output: ", (command, "bold")), soft_wrap=True)
        if result.get("error"):
            console.print(Text(f"✗ {result['error']}", style="bold red"))
        cells = [c for c in result.get("cells") or [] if c.get("status") != "skipped"]  # markdown, raw
        done = sum(1 for c in cells if c.get("status") == "complete")
        total = state.total if state.total is not None else len(cells)
        if result.get("timed_out"):
            word, style = "timed out", "yellow"
        elif result.get("cancelled"):
            word, style = "cancelled", "yellow"
        elif result.get("error") or any(c.get("status") == "error" for c in cells):
            word, style = "failed", "red"
        else:
            word, style = "done", "green"
        if result.get("session"):
            where = f" · session {result['session']}"
        elif result.get("path") or state.plan.where:  # a notebook run, an eval in a notebook's kernel
            where = f" · {result.get('path') or state.plan.where}"
        else:
            where = f" · {result.get('mode') or 'per-call'}"
        ended = state.monotonic(state.plan.ended) if state.plan.ended is not None else time.monotonic()
        console.print(
            Text.assemble(
                (word, f"bold {style}"),
                (f" · {done}/{total} cells complete · {seconds(ended - state.started)}{where}", "dim"),
            )
        )

    # -- notebooks -------------------------------------------------------------------------------------

    def _source(self, source: str, cell_type: str | None, expand: bool) -> RenderableType:
        lines = source.split("\n")
        hidden = 0 if expand or len(lines) <= COLLAPSED_LINES else len(lines) - COLLAPSED_LINES
        shown = "\n".join(lines[: len(lines) - hidden])
        syntax = Syntax(
            shown,
            LEXERS.get(cell_type or "", "text"),
            theme="ansi_dark",
            background_color="default",
            word_wrap=True,
        )
        rows: list[RenderableType] = [syntax]
        if hidden:
            rows.append(
                Text(f"… {hidden} more line{'s' if hidden > 1 else ''} (--expand to show)", style="dim")
            )
        return Padding(Group(*rows), (0, 0, 0, 4))

    def _call_line(self, call: NotebookCall, details: dict[str, Any] | None = None) -> Text:
        text = Text.assemble(("● ", "cyan"), (call.action, "bold"), " ", (call.path, "underline"))
        details = details or {}
        if "cellIndex" in details:
            where = f"cell {details['cellIndex']}"
            if "fromIndex" in details:
                where = f"cell {details['fromIndex']} → {details['cellIndex']}"
            if details.get("cellId"):
                where += f" ({details['cellId']})"
            text.append(f" · {where}")
        elif call.cell is not None:
            text.append(f" · cell {call.cell}")
        cell_type = details.get("cellType") or call.cell_type
        if cell_type:
            text.append(f" · {cell_type}", style="dim")
        return text

    def notebook_change(self, call: NotebookCall, answer: dict[str, Any], expand: bool) -> None:
        details = answer.get("details") or {}
        self.console.print(self._call_line(call, details))
        self.console.print(Text.assemble(("  ⎿ ", "dim"), (str(answer.get("message") or ""), "green")))
        source = str(details.get("cellSource") or "")
        if source:
            if details.get("action") == "delete":
                self.console.print(Text("    removed source:", style="dim"))
            self.console.print(self._source(source, details.get("cellType"), expand))

    def notebook(
        self, answer: dict[str, Any], cells: list[dict[str, Any]], outputs: bool, expand: bool
    ) -> None:
        total = len(answer.get("cells") or [])
        self.console.print(
            Text.assemble(
                (str(answer.get("path")), "bold"),
                f" · {total} cell{'' if total == 1 else 's'} · hash ",
                (str(answer.get("hash")), "dim"),
            )
        )
        for cell in cells:
            header = Text.assemble((f"[{cell.get('index')}] ", "bold"), (str(cell.get("cell_type")), "cyan"))
            if cell.get("id"):
                header.append(f" · id {cell['id']}", style="dim")
            if cell.get("execution_count") is not None:
                header.append(f" · [{cell['execution_count']}]", style="dim")
            self.console.print(header)
            if cell.get("source"):
                self.console.print(
                    self._source(str(cell["source"]), cell.get("cell_type"), expand or len(cells) == 1)
                )
            if outputs and cell.get("cell_type") == "code":
                for output in cell.get("outputs") or []:
                    style = "red" if output.get("output_type") == "error" else ""
                    for line in output_lines(output):
                        self.console.print(Padding(Text(line, style=style), (0, 0, 0, 4)))

    # -- the rest --------------------------------------------------------------------------------------

    def sessions(self, answer: dict[str, Any]) -> None:
        sessions = answer.get("sessions") or []
        pool = pool_line(answer).rstrip("\n")
        if not sessions:
            self.console.print(Text("No sessions.", style="dim"))
        else:
            table = Table(box=None, header_style="bold")
            for title, _ in SESSION_COLUMNS:
                table.add_column(title.lower())
            for s in sessions:
                table.add_row(
                    *(
                        (Text("busy", "yellow") if s.get("busy") else Text("idle", "green"))
                        if key == "busy"
                        else session_cell(s, key)
                        for _, key in SESSION_COLUMNS
                    )
                )
            self.console.print(table)
        if pool:
            self.console.print(Text(pool, style="dim"))

    def done(self, message: str, answer: dict[str, Any]) -> None:
        self.console.print(Text.assemble(("✓ ", "green"), message))

    def listing(self, text: str, answer: dict[str, Any]) -> None:
        self.console.print(Text(text.rstrip("\n")))  # a table's header stays above its columns

    def text(self, pieces: Iterable[str]) -> None:
        self._plain.text(pieces)

    def error(self, message: str, call: NotebookCall | None = None) -> None:
        if call is not None:
            self.errors.print(self._call_line(call))
        self.errors.print(Text.assemble(("Error: ", "bold red"), (message, "red")))

    def note(self, message: str) -> None:
        self.errors.print(Text(message, style="dim"))
