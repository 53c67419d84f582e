"""Which service runs an eval body, and what it needs beyond running code: the one rule of the front
doors (the HTTP route, the MCP tool, attached, detached or once approved).

An eval in a notebook's kernel (``notebook`` in the body) is the notebook runner's, in the turn that
notebook's runs take, and reads the notebook (its cells' outputs come back): it needs ``read`` on
``contents`` too. Any other is :class:`EvalService`'s. Neither service knows the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from ..answers import EvalAnswer
from ..stream_events import Emit
from .eval_service import EvalService
from .notebook_run import NotebookRunner
from .pace import StreamPace


def extra_permissions(body: Any) -> tuple[tuple[str, str], ...]:
    """The (action, resource) pairs an eval body needs beyond its door's own (``execute`` on
    ``kernels``), asked before anything is asked of the person or runs."""
    if isinstance(body, dict) and "notebook" in body:
        return (("read", "contents"),)
    return ()


def run_eval(
    evals: EvalService,
    runner: NotebookRunner,
    body: Any,
    *,
    emit: Emit,
    cancel: asyncio.Event,
    pace: StreamPace | None = None,
) -> Awaitable[EvalAnswer]:
    """The service call of an eval body (answer and events as the service gives them)."""
    if isinstance(body, dict) and "notebook" in body:
        return runner.eval(body, emit=emit, cancel=cancel, pace=pace)
    return evals.run(body, emit=emit, cancel=cancel, pace=pace)
