""":class:`AgentClient`: the client for code without an event loop (the CLI, scripts, notebooks).

It is :class:`AsyncAgentClient` run on an event loop of its own in a daemon thread: each method is the
async one, waited for; each stream is the async one, iterated a step at a time. So there is one
implementation of every call. Ctrl-C (or any exception) while a call waits cancels it on that loop and
waits for the cancellation to finish, so a stream's connection is closed (which interrupts its run)
before the exception reaches the caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from . import calls
from .aio import AsyncAgentClient

P = ParamSpec("P")
T = TypeVar("T")
# How long an interrupted call may take to finish its cancellation (closing its connection).
CANCEL_WAIT = 10.0


class _Loop:
    """An event loop in a daemon thread, and a way to wait for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="agent-client", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the loop and wait for it. Interrupted here (Ctrl-C), it is cancelled on the
        loop and waited for, whenever the interrupt lands: the loop runs callbacks in the order they were
        scheduled, so the cancel always comes after the start if the start was scheduled at all."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        started: list[asyncio.Task[T]] = []

        def abandon() -> None:  # not run (or cancelled before its first step): close it, wake the wait
            getattr(coro, "close", lambda: None)()
            if done.cancel():
                done.set_running_or_notify_cancel()  # concurrent.futures.wait() sees only this state

        def settle(task: asyncio.Task[T]) -> None:
            if task.cancelled():
                abandon()
            elif task.exception() is not None:
                done.set_exception(task.exception())
            else:
                done.set_result(task.result())

        async def awaited() -> T:  # create_task takes coroutines; anext() gives an awaitable
            return await coro

        def start() -> None:
            started.append(self.loop.create_task(awaited()))
            started[0].add_done_callback(settle)

        def cancel() -> None:
            if started:
                started[0].cancel()
            else:  # never started: nothing to wait for
                abandon()

        try:
            self.loop.call_soon_threadsafe(start)
            return done.result()
        except BaseException:
            if not done.done():
                self.loop.call_soon_threadsafe(cancel)
                concurrent.futures.wait([done], timeout=CANCEL_WAIT)
            raise

    async def _finish(self) -> None:
        await asyncio.sleep(0)  # finalizers scheduled with call_soon become tasks
        current = asyncio.current_task()
        leftovers = [task for task in asyncio.all_tasks() if task is not current]
        if leftovers:
            _, pending = await asyncio.wait(leftovers, timeout=CANCEL_WAIT)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=CANCEL_WAIT)
        await self.loop.shutdown_asyncgens()

    def iterate(self, stream: AsyncIterator[T]) -> Generator[T, None, None]:
        try:
            while True:
                try:
                    yield self.run(anext(stream))
                except StopAsyncIteration:
                    return
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                self.run(close())

    def stop(self) -> None:
        """Let the loop's leftover work finish (bounded), then stop and close it.

        A stream left early leaves httpx's inner async generators to the loop's finalizer, which closes
        them in tasks of their own; stopping under those would print "Task was destroyed but it is
        pending!" at exit. So wait for them, close what generators remain, and only then stop.
        """
        # broad: a second Ctrl-C (KeyboardInterrupt) or any failure while closing: stop anyway
        with contextlib.suppress(BaseException):
            self.run(self._finish())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CANCEL_WAIT)
        if not self._thread.is_alive():
            self.loop.close()


def _waits(
    method: Callable[Concatenate[AsyncAgentClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[AgentClient, P], T]:
    @functools.wraps(method)
    def call(self: AgentClient, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._loop.run(method(self._async, *args, **kwargs))

    return call


def _iterates(
    method: Callable[Concatenate[AsyncAgentClient, P], AsyncIterator[T]],
) -> Callable[Concatenate[AgentClient, P], Generator[T, None, None]]:
    @functools.wraps(method)
    def call(self: AgentClient, *args: P.args, **kwargs: P.kwargs) -> Generator[T, None, None]:
        return self._loop.iterate(method(self._async, *args, **kwargs))

    return call


class AgentClient:
    """The client, blocking: the methods of :class:`AsyncAgentClient` (same arguments, same answers), each
    waited for; streams are plain iterators. Use it as a context manager, or call :meth:`close`.

    ``transport`` lets tests plug in an ``httpx`` transport (e.g. ``httpx.MockTransport``).
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = calls.DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        client: str | None = None,
    ):
        self._async = AsyncAgentClient(url, token, timeout=timeout, transport=transport, client=client)
        self.url, self.token = self._async.url, self._async.token
        self._loop = _Loop()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections and the client's event loop."""
        try:
            self._loop.run(self._async.aclose())
        finally:
            self._loop.stop()

    eval = _waits(AsyncAgentClient.eval)
    stream_eval = _iterates(AsyncAgentClient.stream_eval)
    read_notebook = _waits(AsyncAgentClient.read_notebook)
    read_notebook_text = _waits(AsyncAgentClient.read_notebook_text)
    read_output = _waits(AsyncAgentClient.read_output)
    read_output_data = _waits(AsyncAgentClient.read_output_data)
    edit_notebook = _waits(AsyncAgentClient.edit_notebook)
    run_notebook = _waits(AsyncAgentClient.run_notebook)
    stream_run_notebook = _iterates(AsyncAgentClient.stream_run_notebook)
    sessions = _waits(AsyncAgentClient.sessions)
    interrupt = _waits(AsyncAgentClient.interrupt)
    delete_session = _waits(AsyncAgentClient.delete_session)
    tokens = _waits(AsyncAgentClient.tokens)
    create_token = _waits(AsyncAgentClient.create_token)
    revoke_token = _waits(AsyncAgentClient.revoke_token)
    approvals = _waits(AsyncAgentClient.approvals)
    approval = _waits(AsyncAgentClient.approval)
    wait_approval = _waits(AsyncAgentClient.wait_approval)
    decide_approval = _waits(AsyncAgentClient.decide_approval)
    artifact = _waits(AsyncAgentClient.artifact)
    stream_artifact = _iterates(AsyncAgentClient.stream_artifact)
    notebook_changes = _waits(AsyncAgentClient.notebook_changes)
    notebook_change = _waits(AsyncAgentClient.notebook_change)
    undo_change = _waits(AsyncAgentClient.undo_change)
    changes = _waits(AsyncAgentClient.changes)
    create_notebook = _waits(AsyncAgentClient.create_notebook)
    replace_in_cell = _waits(AsyncAgentClient.replace_in_cell)
    list_files = _waits(AsyncAgentClient.list_files)
    detach_eval = _waits(AsyncAgentClient.detach_eval)
    detach_run_notebook = _waits(AsyncAgentClient.detach_run_notebook)
    runs = _waits(AsyncAgentClient.runs)
    run = _waits(AsyncAgentClient.run)
    cancel_run = _waits(AsyncAgentClient.cancel_run)
    run_events = _iterates(AsyncAgentClient.run_events)
    notebook_kernel = _waits(AsyncAgentClient.notebook_kernel)
