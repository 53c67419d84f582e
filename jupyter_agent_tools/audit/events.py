"""The audit facade: one call per auditable fact emits its jupyter_events event and moves its metrics.

Events go through the server's own ``serverapp.event_logger`` (the one jupyter_server's contents and
kernel events use), so whatever handlers an admin configured there (``c.EventLogger.handlers``: a file,
syslog, a log shipper) receive them. Schemas ship in :data:`SCHEMA_DIR` and are registered when the
extension starts; ``event_logger.emit`` validates every event against its schema (and does nothing at all
when no handler or listener is configured). Code is not in events unless ``include_code`` is set, and
outputs never are. An event that cannot be emitted is logged and never fails the call it describes.

Services that are built without an :class:`Audit` (unit tests, other embeddings) get :data:`NO_AUDIT`,
which moves metrics and emits nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traitlets import Any as AnyTrait
from traitlets import Bool

from ..compat import event_listeners
from ..service import Service
from . import metrics
from .context import AGENT_PREFIX, current_user

if TYPE_CHECKING:
    from ..execution.kernel_session import KernelSession

SCHEMA_DIR = Path(__file__).parent / "event_schemas"
SCHEMA_BASE = "https://events.jupyter.org/jupyter_agent_tools"
NOTEBOOK_CHANGE = f"{SCHEMA_BASE}/notebook_change/v1"
EXECUTION = f"{SCHEMA_BASE}/execution/v1"
SESSION = f"{SCHEMA_BASE}/session/v1"
RECOVERY = f"{SCHEMA_BASE}/recovery/v1"
REFUSAL = f"{SCHEMA_BASE}/refusal/v1"
LEDGER_CHANGE = f"{SCHEMA_BASE}/ledger_change/v1"
APPROVAL = f"{SCHEMA_BASE}/approval/v1"
FOCUS = f"{SCHEMA_BASE}/focus/v1"
SCHEMA_IDS = (NOTEBOOK_CHANGE, EXECUTION, SESSION, RECOVERY, REFUSAL, LEDGER_CHANGE, APPROVAL, FOCUS)

# The outcome of each kind of recovery as EvalSessionManager.record() reports it (a retry reports its
# end too).
RECOVERY_OUTCOMES = {
    "deaths": "deferred",
    "restarts": "recovered",
    "manager_restarts": "recovered",
    "restart_limit": "failed",
    "wedged_restarts": "recovered",
    "create_retries": "retrying",
    "emfile_recoveries": "retrying",
    "lost_idle": "degraded",
}
# EvalSessionManager.record() kinds that are lifecycle steps of a session, not recoveries.
LIFECYCLE_KINDS = {"evictions": "evicted", "idle_shutdowns": "idle_culled", "dead_sweeps": "dead_culled"}


def schema_files() -> list[Path]:
    """The shipped event schemas (``event_schemas/<name>/v<N>.yaml``)."""
    return sorted(SCHEMA_DIR.glob("*/v*.yaml"))


def changed_cells(before: Sequence[Any], after: Sequence[Any]) -> tuple[list[str], int]:
    """Ids of the cells added, removed or changed between two cell lists (in the new order, then the
    removed ones), and how many cells changed in all (by id, or by position when a cell has no id)."""

    def by_id(cells: Sequence[Any]) -> dict[str, Any]:
        return {c["id"]: c for c in cells if isinstance(c, dict) and isinstance(c.get("id"), str)}

    old, new = by_id(before), by_id(after)
    ids = [i for i, cell in new.items() if old.get(i) != cell]
    ids += [i for i in old if i not in new]
    if len(old) == len(before) and len(new) == len(after):
        return ids, len(ids)
    return ids, sum(1 for a, b in zip_longest(before, after) if a != b)


@dataclass
class ExecutionRecord:
    """What an eval call or notebook run got to know, for its execution event (:meth:`Audit.executing`)."""

    mode: str
    code: list[str] = field(default_factory=list)
    session: str | None = None
    path: str | None = None
    result: Mapping[str, Any] | None = None
    started: float = field(default_factory=time.monotonic)


class Audit(Service):
    """Emits the extension's audit events and moves its Prometheus metrics (see the module doc)."""

    event_logger = AnyTrait(
        None,
        allow_none=True,
        help="jupyter_events EventLogger to emit to (the server's); None: metrics only.",
    )
    include_code = Bool(
        False,
        help="Put the source of the cells an agent ran or changed into the audit events (execution: "
        "'code'; notebook_change: 'sources'). Off by default: code can hold secrets. Outputs are never "
        "in events.",
    ).tag(config=True)

    def register_schemas(self) -> None:
        """Register the shipped schemas with the event logger (once per logger)."""
        logger = self.event_logger
        if logger is None:
            return
        for path in schema_files():
            logger.register_event_schema(path)

    def listening(self, schema_id: str) -> bool:
        """Whether an event of ``schema_id`` would reach anyone (a handler or a listener of the logger):
        events nobody receives are not even built."""
        logger = self.event_logger
        if logger is None:
            return False
        if logger.handlers:
            return True
        return any(found is None or found.get(schema_id) for found in event_listeners(logger))

    def emit(self, schema_id: str, data: dict[str, Any]) -> None:
        """Emit one event; a failure (an invalid event, a broken handler) is logged, never raised."""
        logger = self.event_logger
        if logger is None or not self.listening(schema_id):
            return
        person = os.environ.get("JUPYTERHUB_USER")
        if person and str(data.get("user") or "").startswith(AGENT_PREFIX):
            data = {**data, "on_behalf_of": person}  # on a hub server: the person the agent acts for
        try:
            logger.emit(schema_id=schema_id, data=data)
        except Exception:
            # broad: jupyter_events' validation, handlers and listeners must not fail the audited action;
            # logged
            self.log.exception("audit event %s was not recorded: %r", schema_id, data)

    # -- notebooks --------------------------------------------------------------------------------

    def notebook_changed(
        self,
        *,
        path: str,
        actions: Iterable[str],
        before: dict[str, Any],
        after: dict[str, Any],
        hash_before: str,
        hash_after: str,
        live: bool,
        undoes: str | None = None,
    ) -> None:
        actions = list(actions)
        target = "live" if live else "file"
        for action in actions:
            metrics.NOTEBOOK_EDITS.labels(action=action, target=target).inc()
        if not self.listening(NOTEBOOK_CHANGE):
            return
        after_cells = after.get("cells") or []
        ids, count = changed_cells(before.get("cells") or [], after_cells)
        data: dict[str, Any] = {
            "user": current_user(),
            "path": path,
            "actions": actions,
            "cell_ids": ids,
            "cells_changed": count,
            "hash_before": hash_before,
            "hash_after": hash_after,
            "target": target,
        }
        if undoes is not None:
            data["undoes"] = undoes
        if self.include_code:
            wanted = set(ids)
            data["sources"] = {
                c["id"]: _source(c.get("source"))
                for c in after_cells
                if isinstance(c, dict) and c.get("id") in wanted
            }
        self.emit(NOTEBOOK_CHANGE, data)

    # -- executions -------------------------------------------------------------------------------

    @contextmanager
    def executing(self, mode: str) -> Iterator[ExecutionRecord]:
        """Record the eval call or notebook run inside the block when it ends (:meth:`execution`): with
        the block's ``record.result``, or the exception that left the block (then re-raised). The block
        fills in the record's fields as it learns them (mode, code, session, path)."""
        record = ExecutionRecord(mode)
        try:
            yield record
        except Exception as e:
            # broad: any failure of the recorded call is recorded as its outcome, then re-raised
            self.execution(record, error=e)
            raise
        self.execution(record)

    def execution(self, record: ExecutionRecord, error: BaseException | None = None) -> None:
        """An eval call or notebook run ended with ``record.result`` (its answer) or ``error``."""
        elapsed = max(0.0, time.monotonic() - record.started)
        mode, result = record.mode, record.result if error is None else None
        status = execution_status(result, error)
        metrics.EVALS.labels(mode=mode, status=status).inc()
        metrics.EVAL_DURATION.labels(mode=mode).observe(elapsed)
        if mode == "notebook":
            metrics.NOTEBOOK_RUNS.labels(status=status).inc()
        cells = list((result or {}).get("cells") or [])
        for cell in cells:
            metrics.CELLS.labels(mode=mode, status=str(cell.get("status"))).inc()
        if not self.listening(EXECUTION):
            return
        data: dict[str, Any] = {
            "user": current_user(),
            "mode": mode,
            "session": record.session,
            "status": status,
            "duration_ms": int(elapsed * 1000),
            "cell_count": len(record.code),
        }
        if record.path is not None:
            data["path"] = record.path
        if result is not None:
            data.update(
                kernel_id=result.get("kernel_id"),
                timed_out=bool(result.get("timed_out")),
                cancelled=bool(result.get("cancelled")),
                restarted=bool(result.get("restarted")),
                cells=[_cell_entry(c) for c in cells],
                output_bytes=sum(int(c.get("total_bytes") or 0) for c in cells),
                artifact_ids=[str(c["artifact_id"]) for c in cells if c.get("artifact_id")],
            )
            if result.get("error"):
                data["message"] = str(result["error"])
        if error is not None:
            http_code = getattr(error, "status", None) or getattr(error, "status_code", None)
            data["http_status"] = http_code if isinstance(http_code, int) else 500
            data["message"] = str(
                getattr(error, "message", None) or getattr(error, "log_message", None) or error
            )
        if self.include_code:
            data["code"] = list(record.code)
        self.emit(EXECUTION, data)

    # -- sessions ---------------------------------------------------------------------------------

    def session(self, session: KernelSession, action: str, **extra: Any) -> None:
        """A lifecycle step of ``session`` (created, evicted, idle_culled, ...)."""
        metrics.SESSION_EVENTS.labels(action=action).inc()
        if not self.listening(SESSION):
            return
        self.emit(
            SESSION,
            {
                "user": current_user(),
                "owner": session.owner,
                "session": session.name,
                "action": action,
                "mode": session.mode,
                "kernel_id": session.kernel_id,
                **extra,
            },
        )

    def call(self, session: KernelSession, step: str) -> None:
        """A call of ``session`` waits for its turn (``call_queued``), takes it (``call_started``), starts
        a cell (``cell_started``) or ends (``call_ended``): session events with the session's queue and
        notebook, no metrics (the execution event counts calls)."""
        if not self.listening(SESSION):
            return
        data: dict[str, Any] = {
            "user": current_user(),
            "owner": session.owner,
            "session": session.name,
            "action": step,
            "mode": session.mode,
            "kernel_id": session.kernel_id,
            "queue_depth": session.waiting,
        }
        if session.notebook is not None:
            data["notebook"] = session.notebook
        if step == "cell_started" and session.running_cell is not None:
            data["cell"] = {k: v for k, v in session.running_cell.items() if v is not None}
        self.emit(SESSION, data)

    def recovery(self, session: KernelSession, kind: str, outcome: str, message: str = "") -> None:
        """A recovery of ``session``'s kernel and how it ended."""
        metrics.RECOVERIES.labels(kind=kind, outcome=outcome).inc()
        if outcome == "retrying" and kind in ("create_retries", "emfile_recoveries"):
            cause = "http_5xx" if kind == "create_retries" else "emfile"
            metrics.KERNEL_CREATE_RETRIES.labels(cause=cause).inc()
        if not self.listening(RECOVERY):
            return
        self.emit(
            RECOVERY,
            {
                "user": current_user(),
                "session": session.name,
                "mode": session.mode,
                "kernel_id": session.kernel_id,
                "kind": kind,
                "outcome": outcome,
                "message": message,
            },
        )

    def recorded(self, session: KernelSession, kind: str, message: str, **extra: Any) -> None:
        """What :meth:`EvalSessionManager.record` counted: a lifecycle step or a recovery."""
        if kind in LIFECYCLE_KINDS:
            self.session(session, LIFECYCLE_KINDS[kind], **extra)
        elif kind in RECOVERY_OUTCOMES:
            self.recovery(session, kind, RECOVERY_OUTCOMES[kind], message)

    # -- the change ledger ------------------------------------------------------------------------

    def ledger_change(self, entry: dict[str, Any]) -> None:
        """The change ledger recorded ``entry`` (its ChangeEntry, as ``GET /api/agent/changes`` lists it):
        what a review panel shows of it, live."""
        if not self.listening(LEDGER_CHANGE):
            return
        data = {k: v for k, v in entry.items() if k != "id" and v is not None}
        self.emit(LEDGER_CHANGE, {**data, "user": entry.get("user"), "change_id": entry["id"]})

    # -- the approval gate ------------------------------------------------------------------------

    def approval(self, approval: dict[str, Any], event: str) -> None:
        """An approval request was made (``requested``) or ended (``approved``, ``denied``, ``expired``,
        ``withdrawn``)."""
        metrics.APPROVALS.labels(decision=event).inc()
        if not self.listening(APPROVAL):
            return
        data = {
            "event": event,
            "approval_id": approval["id"],
            "user": approval["agent"],  # (the schema's name for the acting identity, as in every event)
            **{k: approval[k] for k in ("door", "action", "path", "summary", "decided_by", "reason")},
            "expires": approval["expires"],
        }
        self.emit(APPROVAL, data)

    # -- requests ---------------------------------------------------------------------------------

    def refused(
        self,
        *,
        route: str,
        method: str,
        action: str,
        resource: str,
        user: str | None,
        reason: str | None = None,
    ) -> None:
        """The server's authorizer refused ``action`` on ``resource`` to an agent route or tool (or, for
        an agent token, to any route; ``reason`` then says which scope or path it lacks)."""
        metrics.REFUSALS.labels(route=route, resource=resource).inc()
        data = {"user": user, "route": route, "method": method, "action": action, "resource": resource}
        if reason is not None:
            data["reason"] = reason
        self.emit(REFUSAL, data)

    def request_error(self, route: str, status: int) -> None:
        """An agent request answered a 4xx."""
        metrics.REQUEST_ERRORS.labels(route=route, status_code=str(status)).inc()


def execution_status(result: Mapping[str, Any] | None, error: BaseException | None) -> str:
    """ok, error, timeout, cancelled or failed (see the execution schema)."""
    if error is not None or result is None:
        return "failed"
    if result.get("timed_out"):
        return "timeout"
    if result.get("cancelled"):
        return "cancelled"
    if result.get("error") or any(c.get("status") == "error" for c in result.get("cells") or []):
        return "error"
    return "ok"


def _cell_entry(cell: dict[str, Any]) -> dict[str, Any]:
    return {
        "index": int(cell.get("index") or 0),
        "cell_id": cell.get("cell_id"),
        "status": str(cell.get("status")),
        "duration_ms": int(cell.get("duration_ms") or 0),
        "output_bytes": int(cell.get("total_bytes") or 0),
        "artifact_id": cell.get("artifact_id"),
    }


def _source(source: Any) -> str:
    return "".join(source) if isinstance(source, list) else str(source or "")


NO_AUDIT = Audit()
