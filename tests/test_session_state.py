"""The session state machine: every transition a session may make is in one table, and only there."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jupyter_agent_tools.execution.kernel_session import (
    TRANSITIONS,
    InvalidTransition,
    KernelSession,
    SessionState,
)

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


class FakeKernels:
    """Records shutdowns; the kernel manager adapter is all a session needs besides a launcher."""

    def __init__(self) -> None:
        self.shut_down: list[str] = []

    async def shutdown(self, kernel_id: str) -> None:
        self.shut_down.append(kernel_id)


class FakeConnection:
    kernel_id = "k"
    lost_state = False

    async def close(self) -> None:
        return None


def session() -> tuple[KernelSession, FakeKernels]:
    kernels = FakeKernels()
    return KernelSession("s", kernels), kernels  # type: ignore[arg-type]


async def launch_ok() -> tuple[str, Any]:
    return "k1", FakeConnection()


async def launch_fails() -> tuple[str, Any]:
    raise OSError("no kernel")


def test_closed_is_final_and_every_state_can_close():
    assert TRANSITIONS[SessionState.CLOSED] == frozenset()
    for state in SessionState:
        if state is not SessionState.CLOSED:
            assert SessionState.CLOSED in TRANSITIONS[state]


async def test_start_then_replace_stops_the_old_kernel():
    s, kernels = session()
    await s.start_kernel("python3", launch_ok)
    assert s.state is SessionState.READY and s.kernel_id == "k1"
    await s.start_kernel("python3", launch_ok)
    assert kernels.shut_down == ["k1"] and s.state is SessionState.READY


async def test_failed_start_falls_back_to_new_or_dead():
    s, _ = session()
    with pytest.raises(OSError):
        await s.start_kernel("python3", launch_fails)
    assert s.state is SessionState.NEW and s.kernel_id is None
    await s.start_kernel("python3", launch_ok)
    with pytest.raises(OSError):
        await s.start_kernel("python3", launch_fails)
    assert s.state is SessionState.DEAD  # it had a kernel: the next call says it was lost


async def test_dead_and_dropped_kernels():
    s, kernels = session()
    await s.start_kernel("python3", launch_ok)
    await s.mark_dead()
    assert s.state is SessionState.DEAD and kernels.shut_down == ["k1"]
    await s.start_kernel("python3", launch_ok)
    await s.drop_kernel()
    assert s.state is SessionState.NEW


async def test_invalid_transitions_raise():
    s, _ = session()
    with pytest.raises(InvalidTransition):
        s._to(SessionState.READY)  # no kernel was started
    await s.close()
    with pytest.raises(InvalidTransition):
        await s.start_kernel("python3", launch_ok)


async def test_close_during_start_leaves_no_kernel():
    s, kernels = session()
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow_launch() -> tuple[str, Any]:
        started.set()
        await release.wait()
        return "k9", FakeConnection()

    task = asyncio.ensure_future(s.start_kernel("python3", slow_launch))
    await started.wait()
    await s.close()
    release.set()
    await task
    assert s.closed and s.kernel_id is None and kernels.shut_down == ["k9"]


async def test_turns_are_first_come_first_served_and_cancellable():
    s, _ = session()
    assert await s.take_turn(asyncio.Event())
    assert s.busy and not s.idle
    order: list[int] = []

    async def wait(n: int, cancel: asyncio.Event) -> None:
        if await s.take_turn(cancel):
            order.append(n)
            await s.end_turn()

    cancelled = asyncio.Event()
    waiters = [asyncio.ensure_future(wait(n, cancelled if n == 1 else asyncio.Event())) for n in range(3)]
    await asyncio.sleep(0.01)
    assert s.waiting == 3
    cancelled.set()
    await asyncio.sleep(0.01)
    await s.end_turn()
    await asyncio.gather(*waiters)
    assert order == [0, 2] and s.idle
