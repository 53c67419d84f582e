"""The eval stack the server builds (EvalService, its sessions, recovery policy and warm pool, the real
kernel service) over a fake kernel manager (:mod:`jupyter_agent_tools.testing.fake_kernel`), for the
quick tier: the recovery, pool and turn tests that need no real kernel's behaviour run in milliseconds.

A plugin of the suite (tests/conftest.py): its ``stacks`` fixture makes stacks and shuts each down after
the test.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jupyter_server.services.contents.filemanager import FileContentsManager

from jupyter_agent_tools.artifacts import ArtifactStore
from jupyter_agent_tools.audit import Audit
from jupyter_agent_tools.execution.cells import CellExecutor
from jupyter_agent_tools.execution.eval_service import EvalService
from jupyter_agent_tools.execution.kernel_session import KernelSession
from jupyter_agent_tools.execution.pool import KernelPool
from jupyter_agent_tools.execution.recovery import KernelRecovery
from jupyter_agent_tools.execution.session_manager import EvalSessionManager
from jupyter_agent_tools.testing.fake_kernel import FakeKernelManager, FakeKernelService, Script


class RecordingAudit(Audit):
    """The audit, also keeping the (kind, outcome) of every recovery it is told, in order."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.recoveries: list[tuple[str, str]] = []

    def recovery(self, session: KernelSession, kind: str, outcome: str, message: str = "") -> None:
        self.recoveries.append((kind, outcome))
        super().recovery(session, kind, outcome, message)


@dataclass
class Stack:
    """What a quick test drives and looks at."""

    service: EvalService
    manager: FakeKernelManager
    audit: RecordingAudit

    @property
    def sessions(self) -> EvalSessionManager:
        return self.service.sessions

    @property
    def pool(self) -> KernelPool:
        return self.service.pool

    @property
    def recovery(self) -> KernelRecovery:
        return self.service.recovery

    async def eval(
        self, *codes: str, cancel: asyncio.Event | None = None, events: list[Any] | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Run an eval request body (``cells`` from ``codes``, ``session="s"`` unless ``fields`` say)."""
        body: dict[str, Any] = {"cells": [{"code": code} for code in codes], **fields}
        if body.get("mode") != "per-call":
            body.setdefault("session", "s")
        emit = events.append if events is not None else None
        return await self.service.run(body, emit=emit, cancel=cancel)

    def connection(self, name: str = "s") -> Any:
        """The fake connection of session ``name``."""
        session = self.sessions.get(name)
        assert session is not None and session.connection is not None
        return session.connection


def fake_stack(
    root: Path,
    script: Script | None = None,
    *,
    pool_size: int = 0,
    max_sessions: int = 4,
    interrupt_grace: float = 0.05,
) -> Stack:
    """The stack over a fake kernel manager whose kernels run ``script``; ``root``: the server root
    (a real contents manager's) and, under it, the artifacts. No heartbeat or sweep runs by itself."""
    manager = FakeKernelManager(script, root_dir=root)
    kernels = FakeKernelService(kernel_manager=manager, ready_timeout=1.0, fd_headroom=0)
    audit = RecordingAudit()
    artifacts = ArtifactStore(root=root / ".artifacts")
    sessions = EvalSessionManager(
        kernels=kernels,
        artifacts=artifacts,
        audit=audit,
        max_sessions=max_sessions,
        heartbeat_interval=0,
        cleanup_interval=0,
    )
    pool = KernelPool(kernels=kernels, size=pool_size, retry_delay=0.01)
    cells = CellExecutor(
        kernels=kernels,
        artifacts=artifacts,
        sessions=sessions,
        liveness_interval=0.05,
        interrupt_grace=interrupt_grace,
    )
    service = EvalService(
        sessions=sessions,
        kernels=kernels,
        artifacts=artifacts,
        contents_manager=FileContentsManager(root_dir=str(root)),
        pool=pool,
        recovery=KernelRecovery(kernels=kernels, sessions=sessions, pool=pool, retry_backoff=0),
        cells=cells,
    )
    return Stack(service, manager, audit)


@pytest.fixture
def stacks(tmp_path: Path, jp_asyncio_loop: Any) -> Iterator[Callable[..., Stack]]:
    """``stacks(script, **options)``: a :func:`fake_stack` in the test's directory, shut down after it."""
    made: list[Stack] = []
    # The EMFILE recovery collects garbage (gc.collect) to free descriptors: in a process that ran many
    # tests first that takes most of a second. What exists before the test is frozen, not collected.
    gc.freeze()

    def make(script: Script | None = None, **options: Any) -> Stack:
        made.append(fake_stack(tmp_path, script, **options))
        return made[-1]

    try:
        yield make
        for stack in made:
            jp_asyncio_loop.run_until_complete(stack.service.shutdown())
    finally:
        gc.unfreeze()


async def until(done: Callable[[], bool], what: str) -> None:
    """Let the background work (a pool's refill, a per-call kernel's shutdown) go on until ``done()``;
    fail saying ``what`` did not happen if it takes more than a few thousand loop turns."""
    for _ in range(5000):
        if done():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"{what} did not happen")
