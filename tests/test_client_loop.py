"""The blocking client's event loop: Ctrl-C wherever it lands cancels the call and leaves nothing pending.

Ctrl-C is a KeyboardInterrupt raised in the main thread between two bytecodes; where it lands is a matter of
timing. To hit the narrow places every time, these tests raise it from a wrapped ``call_soon_threadsafe``
(a stand-in for the signal, which cannot be aimed at one bytecode for real).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from jupyter_agent_tools.client.blocking import _Loop

pytestmark = pytest.mark.quick


def interrupt_after_scheduling(loop: _Loop) -> None:
    """The next ``call_soon_threadsafe`` schedules its callback, then raises KeyboardInterrupt: the
    signal landing inside ``_write_to_self``, as it did in CI."""
    real = loop.loop.call_soon_threadsafe

    def once(callback: Any, *args: Any) -> Any:
        loop.loop.call_soon_threadsafe = real  # type: ignore[method-assign]
        real(callback, *args)
        raise KeyboardInterrupt

    loop.loop.call_soon_threadsafe = once  # type: ignore[method-assign]


def leftover_tasks(loop: _Loop) -> int:
    async def count() -> int:
        return len(asyncio.all_tasks()) - 1

    return asyncio.run_coroutine_threadsafe(count(), loop.loop).result(5)


def test_an_interrupt_while_scheduling_still_cancels_the_call(caplog: pytest.LogCaptureFixture) -> None:
    loop = _Loop()

    async def forever() -> None:
        await asyncio.sleep(3600)

    interrupt_after_scheduling(loop)
    coro = forever()
    with caplog.at_level(logging.ERROR, logger="asyncio"), pytest.raises(KeyboardInterrupt):
        loop.run(coro)
    assert leftover_tasks(loop) == 0  # run() waited for the cancellation before letting the interrupt go
    assert coro.cr_frame is None  # finished or closed: no "coroutine was never awaited" at exit
    loop.stop()
    assert not [r for r in caplog.records if r.name == "asyncio"]


def test_an_interrupt_before_the_start_leaves_no_unawaited_coroutine() -> None:
    loop = _Loop()
    ran = threading.Event()

    async def work() -> None:
        ran.set()

    real = loop.loop.call_soon_threadsafe

    def refuse(callback: Any, *args: Any) -> Any:  # the signal lands before the callback is scheduled
        loop.loop.call_soon_threadsafe = real  # type: ignore[method-assign]
        raise KeyboardInterrupt

    loop.loop.call_soon_threadsafe = refuse  # type: ignore[method-assign]
    coro = work()
    with pytest.raises(KeyboardInterrupt):
        loop.run(coro)
    assert not ran.is_set()
    assert coro.cr_frame is None  # closed: no "coroutine was never awaited" at exit
    loop.stop()


def test_a_stream_left_early_has_its_inner_generators_closed_before_the_loop_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """httpx's line iterator sits on async generators of its own; a stream cancelled mid-read leaves
    them to the loop's finalizer, which closes each in a task. Stopping under those tasks printed "Task
    was destroyed but it is pending!" after a Ctrl-C."""
    loop = _Loop()
    inner_closed = threading.Event()
    reading = threading.Event()

    async def inner() -> AsyncIterator[int]:
        try:
            yield 1
            yield 2
        finally:
            await asyncio.sleep(0.2)  # closing a connection takes a turn of the loop or more
            inner_closed.set()

    async def outer() -> AsyncIterator[int]:
        chunks = inner()  # held mid-iteration and never closed explicitly, as in httpx
        await anext(chunks)
        reading.set()
        await asyncio.sleep(3600)  # Ctrl-C lands here: `chunks` goes to the loop's finalizer
        yield await anext(chunks)

    stream = loop.iterate(outer())
    # a real SIGINT (interrupt_main only sets a flag, which a thread blocked on a lock does not see)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    # sent whatever happens (a loaded machine may take long to start reading): never a hang on next()
    watcher = threading.Thread(target=lambda: (reading.wait(120), os.kill(os.getpid(), signal.SIGINT)))
    try:
        watcher.start()
        with caplog.at_level(logging.ERROR, logger="asyncio"), pytest.raises(KeyboardInterrupt):
            next(stream)
    finally:
        watcher.join()
        signal.signal(signal.SIGINT, previous)
    loop.stop()
    assert reading.is_set()  # the interrupt landed while the stream was being read
    assert inner_closed.is_set()
    assert not [r for r in caplog.records if r.name == "asyncio"]
