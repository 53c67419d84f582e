"""Which service runs an eval body: the one rule of the front doors (the HTTP route, the MCP tool).

An eval in a notebook's kernel (``notebook`` in the body) is the notebook runner's, in the turn that
notebook's runs take; any other is :class:`EvalService`'s. Neither service knows the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from ..stream_events import Emit
from .eval_service import EvalService
from .notebook_run import NotebookRunner
from .pace import StreamPace


def run_eval(
    evals: EvalService,
    runner: NotebookRunner,
    body: Any,
    *,
    emit: Emit,
    cancel: asyncio.Event,
    pace: StreamPace | None = None,
) -> Awaitable[dict[str, Any]]:
    """The service call of an eval body (answer and events as the service gives them)."""
    if isinstance(body, dict) and "notebook" in body:
        return runner.eval(body, emit=emit, cancel=cancel, pace=pace)
    return evals.run(body, emit=emit, cancel=cancel, pace=pace)
