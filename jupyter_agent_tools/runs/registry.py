"""Detached runs: an eval or a notebook run that goes on when its client goes (no Tornado).

:class:`RunRegistry` is the one owner of every run's state: it starts the call, numbers its events in a
:class:`~.log.RunLog`, derives the state from what the call emits and answers, and keeps finished runs
for ``run_retention`` seconds (at most ``max_kept_runs`` runs in all). States::

    queued ──first event──▶ running ──answer──▶ complete | error | interrupted | timed_out | cancelled
       └──approval asked──▶ awaiting_approval ──approved──▶ running   (denied, expired: error)
       └──────────────────────────────────────▶ (the same, when the call ends before any event)
    any unfinished state ──server stopped or restarted──▶ lost

``cancelled``: ``POST /api/agent/runs/{id}/cancel`` stopped it; ``timed_out``: its ``timeout`` (a
detached call has none unless it gives one); ``interrupted``: a session interrupt or delete, or the
kernel's interrupt from outside the call (a person's stop button) stopped it; ``error``: a cell failed
or the call did (the answer or message says which). Who may see a run: its owner (the acting user that
started it), and an admin (a caller that is not an agent token: the server's own token, a login)
sees every run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from traitlets import Float, Instance, Int, Unicode, default, validate

from ..artifacts import ArtifactStore
from ..audit.context import current_token, current_user, display_name
from ..errors import AgentToolsError, NotFound, Unavailable
from ..service import Service, at_least
from ..stores import AgentStores, store_options
from ..stream_events import Emit, StreamEvent
from .log import RunLog
from .records import FINAL_STATES, RunRecords

Call = Callable[[Emit, asyncio.Event], Awaitable[Mapping[str, Any]]]
STATES = ("queued", "awaiting_approval", "running", *FINAL_STATES)
ARTIFACT_SESSION = "_runs"  # the artifact store's directory for run event logs
MAX_WAIT = 600.0


@dataclass(frozen=True)
class Viewer:
    """Who asks about runs: their username, and whether they see everyone's."""

    user: str | None
    admin: bool = False

    def sees(self, run: Run) -> bool:
        return self.admin or (run.owner is not None and run.owner == self.user)


@dataclass(eq=False)
class Run:
    """One detached run; its fields change only through :class:`RunRegistry`."""

    id: str
    kind: str  # eval | notebook_run | mcp_tool (an MCP task)
    target: str | None  # the session name (eval), the notebook's path (notebook_run)
    owner: str | None
    created: float
    token: str | None = None  # the id of the agent token that started it (its revocation cancels it)
    state: str = "queued"
    approval_id: int | None = None  # the approval it waited for (the approval gate), if any
    started: float | None = None
    ended: float | None = None
    message: str | None = None  # why it ended as it did, when the answer does not say
    cells: dict[int, dict[str, Any]] = field(default_factory=dict)
    result: Mapping[str, Any] | None = None
    log: RunLog | None = None
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_requested: bool = False
    cancel_reason: str | None = None  # why the server cancelled it (its message when it ends cancelled)
    task: asyncio.Future[Any] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    def summary(self) -> dict[str, Any]:
        cells = list(self.cells.values())
        return {
            "run_id": self.id,
            "kind": self.kind,
            "target": self.target,
            "owner": display_name(self.owner),
            "state": self.state,
            "created": _iso(self.created),
            "started": _iso(self.started),
            "ended": _iso(self.ended),
            "message": self.message,
            "events": self.log.last_seq if self.log is not None else 0,
            "cells_started": len(cells),
            "cells_done": sum(1 for c in cells if c["status"] != "running"),
            "approval_id": self.approval_id,
        }

    def detail(self) -> dict[str, Any]:
        return {**self.summary(), "cells": list(self.cells.values()), "result": self.result}


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def final_state(result: Mapping[str, Any], cancel_requested: bool) -> str:
    """The state a run ends in, from its answer."""
    cells = result.get("cells") or []
    stopped = bool(result.get("cancelled")) or any(c.get("status") == "cancelled" for c in cells)
    if stopped and cancel_requested:
        return "cancelled"
    if result.get("timed_out"):
        return "timed_out"
    if stopped:
        return "interrupted"
    if result.get("error") or any(c.get("status") == "error" for c in cells):
        return "error"
    return "complete"


class RunRegistry(Service):
    """Starts detached runs and owns their state, events and retention; see the module doc.

    The application builds the class named by ``AgentToolsApp.run_registry_class`` with ``parent=app``,
    ``artifacts`` and ``root_dir``; its settings are its own (``c.RunRegistry.*``).
    """

    run_retention = Float(
        3600.0,
        config=True,
        help="Seconds a finished detached run (its state, events and answer) is kept after it ends.",
    )
    max_kept_runs = Int(
        100,
        config=True,
        help="Detached runs kept at most, running or finished; past it the oldest finished run goes, and "
        "a new run is refused (503) while all of them still run.",
    )
    run_events_memory_bytes = Int(
        1024 * 1024,
        config=True,
        help="Bytes of one run's events kept in memory; older events move to an artifact (counted against "
        "artifacts_max_bytes), from where a reconnecting reader gets them.",
    )
    run_events_max_bytes = Int(
        64 * 1024 * 1024,
        config=True,
        help="Bytes of one run's events kept in all (memory and artifact); past it output text is left "
        "out of the events (one 'gap' event says how much); the run's answer still has the output as "
        "an attached call's has it.",
    )
    runs_db_path = Unicode(
        config=True,
        help="SQLite file of the minimal run records that let a restarted server say 'lost' ('': "
        "agent_tools_runs.db in AgentStores.state_dir, the Jupyter data directory by default; ':memory:': "
        "none).",
    )
    artifacts = Instance(ArtifactStore, allow_none=True, help="Where run events beyond memory go.")
    root_dir = Unicode("", help="The server's root: run records are this root's.")

    @default("runs_db_path")
    def _default_db_path(self) -> str:
        return AgentStores(parent=self).path("agent_tools_runs.db")

    @validate("run_retention")
    def _valid_retention(self, proposal: Any) -> float:
        return float(at_least(proposal, 0))

    @validate("max_kept_runs", "run_events_memory_bytes")
    def _valid_positive(self, proposal: Any) -> int:
        return int(at_least(proposal, 1))

    @validate("run_events_max_bytes")
    def _valid_max_bytes(self, proposal: Any) -> int:
        return int(at_least(proposal, 4096))

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.runs: dict[str, Run] = {}  # by id, oldest first
        self.records = RunRecords(
            self.runs_db_path, self.root_dir, self.log, store_options(self), on_lost=self._lost_elsewhere
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: concurrent.futures.Future[list[dict[str, Any]]] | None = None
        self._stopping = False
        self._opened = False
        self._ended_tokens: dict[str, str] = {}  # agent tokens that ended (revoked, expired) -> why

    def open(self) -> None:
        """Read the records a previous server process left (its unfinished runs become ``lost``); waits
        for the file (:meth:`load`, at server start, does not hold the event loop; a request in the
        meantime waits for it)."""
        if self._opened:
            return
        if self._loop is None:
            with contextlib.suppress(RuntimeError):
                self._loop = asyncio.get_running_loop()
        if self._opening is None:
            self._opening = self.records.submit_open(self.run_retention)
        rows = self._opening.result()
        if not self._opened:
            self._opened = True
            self._add(rows)

    async def load(self) -> None:
        """:meth:`open` in the records' worker thread (at server start)."""
        if self._opened or self._opening is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._opening = self.records.submit_open(self.run_retention)
        rows = await asyncio.wrap_future(self._opening)
        if not self._opened:
            self._opened = True
            self._add(rows)

    def _lost_elsewhere(self, rows: list[dict[str, Any]]) -> None:
        """Records' worker: runs of another server process on this root that is gone since (a heartbeat
        that stopped) are lost; listed from now on."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._add, rows)

    def _add(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            if row["id"] in self.runs:
                continue
            run = Run(
                id=row["id"],
                kind=row["kind"],
                target=row["target"],
                owner=row["owner"],
                created=row["created"],
                state=row["state"],
                ended=row["ended"],
                message=row["message"],
            )
            run.done.set()
            self.runs[run.id] = run
        self._prune()

    # -- starting ------------------------------------------------------------------------------

    def start(
        self,
        kind: str,
        target: str | None,
        call: Call,
        state_of: Callable[[Mapping[str, Any], bool], str] = final_state,
        approval_id: int | None = None,
    ) -> Run:
        """Start ``call(emit, cancel)`` as a run of the acting user; it goes on whoever waits for it.
        ``state_of(answer, cancel_requested)`` is the state it ends in (an eval's or a run's answer by
        default; an MCP tool call's result for a task). ``approval_id``: the run waits for that approval
        request first (it starts ``awaiting_approval``, as the answer that starts it says)."""
        self.open()
        token = current_token()
        if token is not None and token in self._ended_tokens:  # a call that was past the door when it ended
            raise AgentToolsError(f"No run starts: {self._ended_tokens[token]}.", 403)
        self._prune(room=1)
        if len(self.runs) >= self.max_kept_runs:
            raise Unavailable(
                f"{len(self.runs)} detached runs are running (max_kept_runs = {self.max_kept_runs}): wait "
                "for one to end, or cancel one (POST /api/agent/runs/{id}/cancel)",
                retry_after=5,
            )
        run = Run(
            id=secrets.token_hex(8),
            kind=kind,
            target=target,
            owner=current_user(),
            created=time.time(),
            token=token,
        )
        if approval_id is not None:
            run.state, run.approval_id = "awaiting_approval", approval_id
        artifacts = self.artifacts
        run.log = RunLog(
            memory_bytes=self.run_events_memory_bytes,
            max_bytes=self.run_events_max_bytes,
            open_artifact=(lambda: artifacts.create(ARTIFACT_SESSION, run.owner))
            if artifacts is not None
            else None,
            artifact_path=artifacts.path if artifacts is not None else None,
            log=self.log,
        )
        self.runs[run.id] = run
        self.records.save(run)
        run.task = asyncio.ensure_future(self._drive(run, call, state_of))
        return run

    async def _drive(self, run: Run, call: Call, state_of: Callable[[Mapping[str, Any], bool], str]) -> None:
        def emit(event: StreamEvent) -> None:
            self._event(run, event)

        state, message = "error", None
        try:
            result = await call(emit, run.cancel)
        except AgentToolsError as e:
            message = e.message
            emit({"type": "error", "status": e.status, "message": e.message})
        except asyncio.CancelledError:
            message = "the server stopped while this run ran"
            state = "lost"
        except Exception as e:
            # broad: a run's call failing any way becomes the run's failed state and its last event
            status = getattr(e, "status_code", None)  # tornado's HTTPError from the kernel manager or gateway
            if isinstance(status, int) and 400 <= status < 600:
                message = getattr(e, "log_message", None) or f"HTTP {status}"
            else:
                self.log.exception("detached run %s failed", run.id)
                status, message = 500, "Unhandled error (see the server log)"
            emit({"type": "error", "status": status, "message": message})
        else:
            run.result = result
            state = state_of(result, run.cancel_requested)
            message = result.get("error") if isinstance(result.get("error"), str) else None
        self._end(run, state, message)

    def _event(self, run: Run, event: StreamEvent) -> None:
        if run.finished:
            return
        if event["type"] == "approval":  # the person is asked first: the run waits, then runs once approved
            if event["state"] == "pending" and run.state == "queued":
                self._transition(run, "awaiting_approval")
            run.approval_id = event.get("approval_id")
        elif run.state in ("queued", "awaiting_approval"):
            self._transition(run, "running")
        if event["type"] == "cell_start":
            cell: dict[str, Any] = {
                "index": event["index"],
                "status": "running",
                "started": _iso(time.time()),
            }
            if "cell_id" in event:
                cell["cell_id"] = event["cell_id"]
            cell["title"] = event["title"]
            run.cells[event["index"]] = cell
        elif event["type"] == "cell_end":
            cell = run.cells.setdefault(event["index"], {"index": event["index"]})
            cell.update(
                status=event["status"], exit_code=event["exit_code"], duration_ms=event["duration_ms"]
            )
        if run.log is not None:
            run.log.append(event)

    def _transition(self, run: Run, state: str) -> None:
        """The only place a run's state changes."""
        if run.finished or state not in STATES:
            return
        run.state = state
        now = time.time()
        if state == "running":
            run.started = now
        if state in FINAL_STATES:
            run.ended = now
            if run.started is None:
                run.started = now
        self.records.save(run)

    def _end(self, run: Run, state: str, message: str | None) -> None:
        if self._stopping and state != "lost":
            state, message = "lost", "the server stopped while this run ran"
        if state == "cancelled" and message is None:
            message = run.cancel_reason
        run.message = message
        self._transition(run, state)
        if run.log is not None:
            run.log.finish()
        run.done.set()
        if self.run_retention:
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_later(self.run_retention + 0.5, self._prune)

    # -- reading -------------------------------------------------------------------------------

    def list(self, viewer: Viewer) -> list[Run]:
        """The runs ``viewer`` may see, newest first."""
        self.open()
        self._prune()
        return [run for run in reversed(self.runs.values()) if viewer.sees(run)]

    def get(self, run_id: str, viewer: Viewer) -> Run:
        """A run ``viewer`` may see, or 404 (an unknown run and another owner's look the same)."""
        self.open()
        self._prune()
        run = self.runs.get(run_id)
        if run is None or not viewer.sees(run):
            raise NotFound(
                f"Run not found: {run_id[:80]!r} (finished runs are kept for run_retention = "
                f"{self.run_retention:g} s and at most max_kept_runs = {self.max_kept_runs})"
            )
        return run

    def cancel(self, run_id: str, viewer: Viewer) -> Run:
        """Ask a run to stop (its kernel is interrupted); a finished run is answered as it is."""
        run = self.get(run_id, viewer)
        if not run.finished:
            run.cancel_requested = True
            run.cancel.set()
        return run

    def cancel_token(self, token: str, reason: str) -> int:
        """The agent token ``token`` (its id) ended (revoked, expired): cancel every unfinished run it
        started (a run awaiting approval withdraws its request; nothing starts); how many."""
        self._ended_tokens[token] = reason
        cancelled = 0
        for run in self.runs.values():
            if run.token == token and not run.finished:
                run.cancel_requested = True
                run.cancel_reason = reason
                run.cancel.set()
                cancelled += 1
        return cancelled

    async def wait(self, run: Run, timeout: float) -> Run:
        """Wait until the run finishes, at most ``timeout`` seconds (at most :data:`MAX_WAIT`)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(run.done.wait()), max(0.0, min(timeout, MAX_WAIT)))
        return run

    # -- keeping -------------------------------------------------------------------------------

    def _prune(self, room: int = 0) -> None:
        """Forget finished runs older than the retention, then the oldest finished past the cap (with
        ``room`` for that many more runs)."""
        cutoff = time.time() - self.run_retention
        for run in [r for r in self.runs.values() if r.finished and (r.ended or 0) < cutoff]:
            self._forget(run)
        over = len(self.runs) + room - self.max_kept_runs
        if over > 0:
            for run in [r for r in self.runs.values() if r.finished][:over]:
                self._forget(run)

    def _forget(self, run: Run) -> None:
        self.runs.pop(run.id, None)
        if run.log is not None:
            run.log.discard()
        self.records.forget(run.id)

    async def shutdown(self) -> None:
        """The server stops: unfinished runs are ``lost`` (their kernels go with the server)."""
        self._stopping = True
        for run in list(self.runs.values()):
            if not run.finished:
                run.message = "the server stopped while this run ran"
                self._transition(run, "lost")
                if run.log is not None:
                    run.log.finish()
                run.done.set()
        self.records.close()
