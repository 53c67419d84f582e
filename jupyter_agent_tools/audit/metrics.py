"""Prometheus metrics of the extension, on jupyter_server's own ``/metrics`` (prometheus_client's default
registry).

Every metric is created once per process (:func:`_metric` returns the one already registered: tests and
embedding applications start many servers in one process, and prometheus_client refuses a name twice).
Labels are low-cardinality by design: modes, statuses, actions, kinds and route names, never a user, a
path or a session name; the one exception is the name of an agent token (``agent_requests``), which the
server's owner creates, never a caller. The gauges are computed when ``/metrics`` is scraped, summed over
the servers of the process (:func:`track`).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..compat import registered_collectors, registered_metric

if TYPE_CHECKING:
    from ..artifacts import ArtifactStore
    from ..execution.pool import KernelPool
    from ..execution.session_manager import EvalSessionManager

PREFIX = "jupyter_agent_"
M = TypeVar("M", Counter, Histogram)

# Eval durations: from a trivial cell (ms) to the longest timeout (600 s).
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# Artifact files counted per scrape at most: a scrape stays a few milliseconds whatever is on disk.
MAX_ARTIFACT_FILES = 20_000


def _metric(kind: type[M], name: str, documentation: str, labels: tuple[str, ...], **extra: Any) -> M:
    """The metric ``name`` of the default registry, created (once per process) if missing."""
    existing = registered_metric(REGISTRY, PREFIX + name)
    if existing is not None:
        return existing
    return kind(PREFIX + name, documentation, labels, **extra)


EVALS = _metric(
    Counter,
    "evals",
    "Eval calls and notebook runs by mode (session, per-call, notebook) and status (ok, error, timeout, "
    "cancelled, failed).",
    ("mode", "status"),
)
EVAL_DURATION = _metric(
    Histogram,
    "eval_duration_seconds",
    "Duration of eval calls and notebook runs, waiting for a turn and a kernel included, by mode.",
    ("mode",),
    buckets=DURATION_BUCKETS,
)
CELLS = _metric(
    Counter,
    "cells",
    "Cells executed by eval calls and notebook runs, by mode and status.",
    ("mode", "status"),
)
NOTEBOOK_RUNS = _metric(
    Counter, "notebook_runs", "Notebook runs (cells run in the notebook's own kernel) by status.", ("status",)
)
NOTEBOOK_EDITS = _metric(
    Counter,
    "notebook_edits",
    "Notebook changes by action (edit, insert, delete, move, clear_outputs; run_outputs and run_clear for "
    "outputs a notebook run wrote) and target (file, live).",
    ("action", "target"),
)
SESSION_EVENTS = _metric(
    Counter,
    "session_events",
    "Session lifecycle steps (created, evicted, idle_culled, dead_culled, deleted, interrupted, shutdown).",
    ("action",),
)
RECOVERIES = _metric(
    Counter,
    "recoveries",
    "Kernel recoveries by kind and outcome (see the recovery event).",
    ("kind", "outcome"),
)
KERNEL_CREATE_RETRIES = _metric(
    Counter,
    "kernel_create_retries",
    "Kernel creations retried after an HTTP >= 500 failure (gateway) or running out of file descriptors, "
    "by cause (http_5xx, emfile).",
    ("cause",),
)
REQUEST_ERRORS = _metric(
    Counter,
    "request_errors",
    "Agent requests answered with a 4xx status, by route name and status code.",
    ("route", "status_code"),
)
REFUSALS = _metric(
    Counter,
    "authorization_refusals",
    "Permissions the server's authorizer refused to agent routes and MCP tools, by route and resource.",
    ("route", "resource"),
)
APPROVALS = _metric(
    Counter,
    "approvals",
    "Approval requests of the approval gate by what happened: requested, approved, denied, expired, "
    "withdrawn.",
    ("decision",),
)
AGENT_REQUESTS = _metric(
    Counter,
    "agent_requests",
    "Requests made with agent tokens (jupyter_agent_tools.auth), by agent name (never the token) and "
    "outcome: authenticated, refused (a scope, path or route the token does not allow), expired, revoked.",
    ("agent", "outcome"),
)

_SESSION_MANAGERS: weakref.WeakSet[EvalSessionManager] = weakref.WeakSet()
_ARTIFACT_STORES: weakref.WeakSet[ArtifactStore] = weakref.WeakSet()
_POOLS: weakref.WeakSet[KernelPool] = weakref.WeakSet()


def track(
    sessions: EvalSessionManager | None = None,
    artifacts: ArtifactStore | None = None,
    pool: KernelPool | None = None,
) -> None:
    """Count this server's sessions, artifacts and warm kernels in the gauges (until they are garbage)."""
    if sessions is not None:
        _SESSION_MANAGERS.add(sessions)
    if artifacts is not None:
        _ARTIFACT_STORES.add(artifacts)
    if pool is not None:
        _POOLS.add(pool)


def artifact_bytes(root: str | os.PathLike[str], limit: int = MAX_ARTIFACT_FILES) -> int:
    """Bytes of the files under an artifact store's root (two levels: session/artifact), at most ``limit``
    files counted."""
    total = counted = 0
    try:
        sessions = list(os.scandir(root))
    except OSError:
        return 0
    for directory in sessions:
        if not directory.is_dir(follow_symlinks=False):
            continue
        try:
            with os.scandir(directory.path) as files:
                for entry in files:
                    if counted >= limit:
                        return total
                    if entry.is_file(follow_symlinks=False):
                        counted += 1
                        with contextlib.suppress(OSError):
                            total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


class _Gauges(Collector):
    """Gauges read at scrape time from the live session managers and artifact stores."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        active = GaugeMetricFamily(
            PREFIX + "sessions_active",
            "Eval sessions that exist now, by mode (session: named; per-call: running calls; notebook: "
            "connections of notebook runs).",
            labels=["mode"],
        )
        counts = {"session": 0, "per-call": 0, "notebook": 0}
        queued = busy = 0
        pool = GaugeMetricFamily(
            PREFIX + "pool_kernels",
            "Kernels of the warm pool (KernelPool.size), by state: ready or starting.",
            labels=["state"],
        )
        pooled = {"ready": 0, "starting": 0}
        for kernel_pool in list(_POOLS):
            pooled["ready"] += kernel_pool.ready_count
            pooled["starting"] += kernel_pool.starting_count
        for manager in list(_SESSION_MANAGERS):
            counts["session"] += len(manager.sessions)
            counts["per-call"] += len(manager.per_call)
            counts["notebook"] += sum(1 for s in manager.notebooks.values() if not s.closed)
            for session in (
                *manager.sessions.values(),
                *manager.per_call.values(),
                *manager.notebooks.values(),
            ):
                queued += session.waiting
                busy += session.busy
        for mode, count in counts.items():
            active.add_metric([mode], count)
        yield active
        for state, count in pooled.items():
            pool.add_metric([state], count)
        yield pool
        yield GaugeMetricFamily(
            PREFIX + "queued_requests", "Calls waiting for their session's turn.", value=queued
        )
        yield GaugeMetricFamily(PREFIX + "busy_sessions", "Sessions running a call now.", value=busy)
        stored = sum(artifact_bytes(store.root) for store in list(_ARTIFACT_STORES))
        yield GaugeMetricFamily(
            PREFIX + "artifacts_bytes", "Bytes of spilled outputs (artifacts) on disk.", value=stored
        )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # collected on scrape only (collect() reads live state)


def _register_gauges() -> None:
    """Register the scrape-time gauges once per process (also when this module is imported again)."""
    if not any(type(c).__qualname__ == _Gauges.__qualname__ for c in registered_collectors(REGISTRY)):
        REGISTRY.register(_Gauges())


_register_gauges()
