"""Run one cell on a kernel connection and turn its Jupyter messages into output and events.

An execution is complete when both the ``execute_reply`` (shell) and ``status: idle`` (iopub) for its
request have arrived. A deadline or a cancel interrupts the kernel and waits, bounded, for it to settle.
A kernel that dies or is restarted under the request ends it at once (``kernel_died``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..stream_events import Emit, StreamEvent
from ..text import strip_ansi
from .connection import KernelConnection, drain
from .messages import (
    CellOutcome,
    Display,
    ErrorInfo,
    Iopub,
    OutputLimits,
    RichOutput,
    Text,
    bounded_error,
    cell_frame,
    interpret_iopub,
    needs_worker,
    read_iopub,
)
from .pace import StreamPace
from .sink import OutputSink, SinkSummary

PACE_POLL = 0.02  # seconds between looks at a lagging stream client's progress (and at cancellation)
# Executions are sent with allow_stdin false: ipykernel's input() raises this at once. Its traceback
# (ipykernel's internals) is replaced by STDIN_NOTICE; a kernel that asks anyway is answered "" (STDIN_EMPTY).
STDIN_REFUSED = "StdinNotImplementedError"
STDIN_NOTICE = "This call cannot read stdin, so input() failed: put the value in the code instead.\n"
STDIN_EMPTY = "This call cannot read stdin, so input() got '': put the value in the code instead.\n"
# A KeyboardInterrupt this call did not cause: someone sent the kernel its interrupt.
INTERRUPTED_NOTICE = (
    "Interrupted from outside this call: someone sent the kernel its interrupt (JupyterLab's stop "
    "button, the Agents panel's Interrupt, or POST /api/kernels/{id}/interrupt). Nothing needs fixing.\n"
)


def noop(_: StreamEvent) -> None:
    """An ``emit`` that drops the events (a caller that streams nothing)."""
    return None


class Observer(Protocol):
    """Sees every iopub message of an execution but its status, as :func:`~.messages.read_iopub` read it
    (a notebook run stores outputs from them)."""

    def add(self, read: Iopub) -> bool:
        """Take one message; whether what is stored changed. Runs in a worker thread for a large message,
        in the same step as the message's interpretation for the answer (one decision, one hop)."""
        ...  # pragma: no cover

    def added(self, changed: bool) -> None:
        """Back on the event loop after :meth:`add`."""
        ...  # pragma: no cover


@dataclass
class CellExecution:
    """What happened when one cell ran."""

    status: str = "complete"  # complete | error | cancelled
    exit_code: int = 0
    error: dict[str, Any] | None = None
    displays: list[dict[str, Any]] = field(default_factory=list)
    stdin_requested: bool = False
    cancelled: bool = False
    timed_out: bool = False
    interrupted: bool = False  # the kernel's interrupt came from outside the call (status cancelled)
    kernel_died: bool = False
    settled: bool = True  # reply and idle both arrived (False: the kernel did not settle in time)
    idle_missing: bool = False  # the reply came but its "idle" never did (iopub messages were lost)
    output_lost: bool = False  # the connection dropped iopub messages meanwhile (past its buffer and spill)
    duration_ms: int = 0
    summary: SinkSummary | None = None
    execution_count: int | None = None  # the kernel's, from the execute_reply

    def result_fields(self) -> dict[str, Any]:
        """The per-cell fields of an answer (eval's and a notebook run's): status, text, displays, sizes."""
        summary = self.summary
        assert summary is not None
        return {
            "status": self.status,
            "output": summary.output,
            "exit_code": self.exit_code,
            "error": self.error,
            "displays": self.displays,
            "duration_ms": self.duration_ms,
            "stdin_requested": self.stdin_requested,
            "truncated": summary.truncated,
            "total_bytes": summary.total_bytes,
            "total_lines": summary.total_lines,
            "output_bytes": summary.output_bytes,
            "output_lines": summary.output_lines,
            "artifact_id": summary.artifact_id,
        }

    def outcome(
        self, index: int, title: str | None, name: str | None = None, has_displays: bool | None = None
    ) -> CellOutcome:
        """How the cell ended, for :func:`~.messages.answer_text` (``index``: its place in the request;
        ``has_displays``: when the answer's displays are not this execution's, a notebook run's images)."""
        assert self.summary is not None
        return CellOutcome(
            index=index,
            title=title,
            name=name,
            status=self.status,
            output=self.summary.output,
            exit_code=self.exit_code,
            has_displays=bool(self.displays) if has_displays is None else has_displays,
            kernel_died=self.kernel_died,
        )


def not_run_fields(status: str) -> dict[str, Any]:
    """:meth:`CellExecution.result_fields` of a cell that did not run (``skipped``, ``not_run``)."""
    empty = SinkSummary(
        output="",
        truncated=False,
        total_bytes=0,
        total_lines=0,
        output_bytes=0,
        output_lines=0,
        artifact_id=None,
    )
    return CellExecution(status=status, summary=empty).result_fields()


@dataclass
class ExecutionLimits:
    """When to stop waiting: the call's deadline (event-loop time) and how long an interrupt may take
    (``interrupt_grace``, ``liveness_interval``: the values of the ``EvalService`` traits)."""

    deadline: float
    timeout_seconds: float
    interrupt_grace: float
    liveness_interval: float
    # After the execute_reply, how long iopub may stay silent before the kernel is asked (an empty
    # request) whether the "idle" was lost: under load a subscriber that falls behind loses iopub
    # messages (ZMQ high-water mark), the idle included. No idle of the probe either (PROBE_GRACES): lost.
    idle_grace: float = 2.0


# How many idle graces to wait for the probe's own idle before assuming it was lost too.
PROBE_GRACES = 5


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


class _Run:
    def __init__(
        self,
        conn: KernelConnection,
        index: int,
        sink: OutputSink,
        emit: Emit,
        output_limits: OutputLimits,
        observer: Observer | None = None,
    ):
        self.conn = conn
        self.index = index
        self.sink = sink
        self.emit = emit
        self.rich = RichOutput(output_limits, save=sink.spill)
        self.observer = observer
        self.result = CellExecution()
        self.msg_id = ""
        self.reply: dict[str, Any] | None = None
        self.idle = False
        self.idle_missing = False
        self.probe: str | None = None  # the empty request sent to learn whether our idle was lost
        self.quiet_since = time.monotonic()  # last message of this execution (reply or iopub)
        self.last_char = "\n"
        self.stopped_at: str | None = None  # where the cell's code was when the timeout interrupted it

    def text(self, text: str, name: str) -> None:
        chunk = self.sink.push(text)
        if chunk:
            self.last_char = chunk[-1]
            self.emit({"type": "chunk", "index": self.index, "name": name, "text": chunk})

    async def handle(self, msg: dict[str, Any]) -> None:
        channel = msg.get("channel")
        if channel == "event":
            if msg.get("event") in ("restarted", "dead", "disconnected"):
                self.result.kernel_died = True
            return
        parent_id = (msg.get("parent_header") or {}).get("msg_id")
        msg_type = str(msg.get("header", {}).get("msg_type") or msg.get("msg_type") or "")
        content = msg.get("content") or {}
        if parent_id is not None and parent_id == self.probe:
            if msg_type == "status" and content.get("execution_state") == "idle" and not self.idle:
                # iopub is ordered: the probe's idle came, so ours (sent before it) was dropped
                self.idle = self.idle_missing = True
            return
        if parent_id != self.msg_id:
            if (
                channel == "iopub"
                and msg_type == "status"
                and not parent_id
                and content.get("execution_state") in ("restarting", "dead")
            ):
                self.result.kernel_died = True
            return
        self.quiet_since = time.monotonic()
        if channel == "shell":
            if msg_type == "execute_reply":
                self.reply = content
            return
        if channel == "stdin":
            if msg_type == "input_request":
                self.result.stdin_requested = True
                self.text(("" if self.last_char == "\n" else "\n") + STDIN_EMPTY, "stderr")
                self.conn.input_reply("", msg)
            return
        if msg_type == "status":
            if content.get("execution_state") == "idle":
                self.idle = True
            return
        read = read_iopub(msg_type, content)  # the one reading of the message
        if read is None:
            return
        if needs_worker(read, storing=self.observer is not None):
            # HTML conversion, large display data, large chunks to store: in a thread, so the server keeps
            # answering. Later messages wait in the queue meanwhile, so the output keeps its order.
            loop = asyncio.get_running_loop()
            changed, items = await loop.run_in_executor(None, self._interpret, read)
        else:
            changed, items = self._interpret(read)
        if self.observer is not None:
            self.observer.added(changed)
        if any(isinstance(i, ErrorInfo) and i.ename == "KeyboardInterrupt" for i in items):
            self.result.interrupted = not self.result.cancelled  # not by this call's timeout or cancel
        ours = next((i for i in items if isinstance(i, ErrorInfo) and self._caused_here(i)), None)
        for item in items:
            if isinstance(item, Text):
                if ours is not None and item.name == "error":
                    continue  # said in one line below, not as a traceback of the kernel's internals
                self.text(item.text, item.name)
            elif isinstance(item, Display):
                self.result.displays.append(item.display)
                self.emit({"type": "display", "index": self.index, "display": item.display})
            elif isinstance(item, ErrorInfo):
                self.result.error = bounded_error(item, self.sink.max_bytes)
        if ours is not None and ours.ename == STDIN_REFUSED:
            self.result.stdin_requested = True
            self.text(("" if self.last_char == "\n" else "\n") + STDIN_NOTICE, "error")
        elif ours is not None:
            self.stopped_at = cell_frame(ours)

    def _interpret(self, read: Iopub) -> tuple[bool, list[Any]]:
        """The message stored (by the observer) and shown in the answer, both from one reading."""
        changed = self.observer.add(read) if self.observer is not None else False
        return changed, interpret_iopub(read, self.rich)

    def _caused_here(self, info: ErrorInfo) -> bool:
        """An error the code did not cause: the refused input(), the timeout's interrupt, or an interrupt
        from outside the call (a person's stop button: told as such, not as the code's error)."""
        return info.ename == STDIN_REFUSED or (
            info.ename == "KeyboardInterrupt" and (self.result.timed_out or self.result.interrupted)
        )

    @property
    def done(self) -> bool:
        return self.reply is not None and self.idle


async def run_cell(
    conn: KernelConnection,
    code: str,
    *,
    index: int,
    sink: OutputSink,
    limits: ExecutionLimits,
    cancel: asyncio.Event,
    interrupt: Callable[[], Awaitable[None]],
    emit: Emit,
    output_limits: OutputLimits,
    silent: bool = False,
    observer: Observer | None = None,
    pace: StreamPace | None = None,
) -> CellExecution:
    """Execute ``code`` and collect its output into ``sink``, streaming events through ``emit``.

    ``observer`` also sees every iopub message of this execution but its status (see :class:`Observer`);
    ``pace``, a stream client's, may hold the kernel's messages back briefly while it lags.
    """
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    run = _Run(conn, index, sink, emit, output_limits, observer)
    drain(conn.messages)
    dropped = getattr(conn.messages, "dropped", 0)
    try:
        run.msg_id = conn.execute(code, silent=silent, store_history=not silent)
    except Exception:
        # broad: the connection is gone (closed websocket, stopped channels, any kind): the kernel is lost
        run.result.kernel_died = True
        return _finish(run, limits, started)
    interrupted_at: float | None = None
    last_alive_check = loop.time()
    cancel_wait = asyncio.ensure_future(cancel.wait())
    try:
        while not run.done and not run.result.kernel_died:
            if pace is not None and not cancel.is_set() and pace.should_wait(conn.messages):
                await pace.wait(PACE_POLL)  # the stream client lags: let the kernel's messages wait
                continue
            try:
                await run.handle(conn.messages.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            now = loop.time()
            if interrupted_at is None and (cancel.is_set() or now >= limits.deadline):
                if cancel.is_set():
                    run.result.cancelled = True
                else:
                    run.result.timed_out = True
                    run.result.cancelled = True
                interrupted_at = now
                # broad: a failed interrupt (any kernel manager, gateway HTTP) still ends the wait below
                with contextlib.suppress(Exception):
                    await interrupt()
                continue
            if interrupted_at is not None and now >= interrupted_at + limits.interrupt_grace:
                break
            wake_at = (
                interrupted_at + limits.interrupt_grace if interrupted_at is not None else limits.deadline
            )
            if run.reply is not None and not run.idle and interrupted_at is None:
                grace = limits.idle_grace * (1 if run.probe is None else PROBE_GRACES)
                idle_due = run.quiet_since + grace
                if time.monotonic() >= idle_due:
                    # A silent iopub may only be slow (the kernel's iopub thread starved on a loaded
                    # machine): an empty request's idle comes after ours on the same ordered socket,
                    # so which of the two arrives first tells whether ours was lost.
                    probe = _send_probe(conn) if run.probe is None else None
                    if probe is None:  # the probe's idle did not come either, or it could not be sent
                        run.idle = run.idle_missing = True
                        break
                    run.probe, run.quiet_since = probe, time.monotonic()
                    continue
                wake_at = min(wake_at, now + (idle_due - time.monotonic()))
            wait = max(0.0, min(limits.liveness_interval, wake_at - now))
            if await conn.messages.arrival(wait, cancel_wait if interrupted_at is None else None):
                continue
            if loop.time() - last_alive_check >= limits.liveness_interval:
                last_alive_check = loop.time()
                if conn.lost_state or not await conn.is_alive():
                    run.result.kernel_died = True
    finally:
        cancel_wait.cancel()
    run.result.output_lost = getattr(conn.messages, "dropped", 0) > dropped
    return _finish(run, limits, started)


def _send_probe(conn: KernelConnection) -> str | None:
    """Send the empty request whose idle tells whether ours was lost; None if it cannot be sent."""
    try:
        return conn.execute("", silent=True, store_history=False)
    except Exception:  # broad: the connection is gone (any connection kind): nothing was sent
        return None


def _finish(run: _Run, limits: ExecutionLimits, started: float) -> CellExecution:
    result = run.result
    reply = run.reply or {}
    held = run.sink.flush()
    if held:
        run.last_char = held[-1]
        run.emit({"type": "chunk", "index": run.index, "name": "stdout", "text": held})
    if result.kernel_died:
        result.status, result.exit_code = "error", 1
        result.error = {
            "ename": "KernelDied",
            "evalue": "The kernel died or was restarted while running this cell",
            "traceback": [],
        }
    elif result.cancelled or result.interrupted:
        result.status, result.exit_code, result.cancelled = "cancelled", 130, True
        prefix = "" if run.last_char == "\n" else "\n"
        if run.stopped_at:
            prefix += f"Stopped in {run.stopped_at}\n"
        if result.timed_out:
            timeout = _format_seconds(limits.timeout_seconds)
            run.text(f"{prefix}Command timed out after {timeout} seconds\n", "stderr")
        elif result.interrupted:
            run.text(prefix + INTERRUPTED_NOTICE, "stderr")
    elif reply.get("status") == "ok" and not result.stdin_requested:
        result.status, result.exit_code = "complete", 0
    else:
        result.status, result.exit_code = "error", 1
        if reply.get("status") == "aborted":
            result.error = {
                "ename": "Aborted",
                "evalue": "The kernel aborted this execution",
                "traceback": [],
            }
        elif reply.get("status") == "error" and result.error is None:
            result.error = {
                "ename": str(reply.get("ename", "")),
                "evalue": str(reply.get("evalue", "")),
                "traceback": [strip_ansi(str(line)) for line in reply.get("traceback", [])],
            }
    result.settled = run.done
    count = reply.get("execution_count")
    result.execution_count = count if isinstance(count, int) else None
    result.idle_missing = run.idle_missing
    result.duration_ms = int((time.monotonic() - started) * 1000)
    result.summary = run.sink.finish()
    return result
