"""Fakes, for tests: a kernel connection (:class:`~jupyter_agent_tools.execution.connection.KernelConnection`)
and the server's kernel manager.

No kernel process, no ZMQ: :meth:`FakeKernelConnection.execute` puts the Jupyter messages a *script*
returns for the code on the connection's queue at once, shaped as :class:`LocalKernelConnection` delivers
them (decoded, tagged with their channel, ``parent_header`` naming the request). It lets the executor,
recovery, pool and turn logic be unit-tested in milliseconds; what needs a real kernel (its protocol, its
signals, ZMQ's limits) stays in the real-kernel tests.

A script maps the code to a list of ``(channel, msg_type, content)``; :func:`replies` builds the usual
one (busy, output, reply, idle). A script that returns no ``execute_reply`` leaves the execution
running, as a kernel stuck in a loop: :meth:`interrupt` then answers it the way ipykernel does
(``KeyboardInterrupt`` error, error reply, idle) unless ``interrupt_settles`` is False. A script that
ends with :func:`dies`' messages kills the kernel in the middle of the execution.

:class:`FakeKernelManager` is a fake of the server's kernel manager (no processes): it starts, restarts,
interrupts and shuts down kernels that are only ids, fails starts and connects on demand (a gateway's
5xx, EMFILE, a kernel that dies before answering), and hands out fake connections to them through
:class:`FakeKernelService`, the real kernel service with only its ``connect`` replaced. With them the
sessions, the recovery policy and the warm pool run unchanged, in milliseconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

from ..execution.connection import KernelConnection, MessageQueue, event
from ..execution.kernel_service import KernelService

Script = Callable[[str], list[tuple[str, str, dict[str, Any]]]]


def replies(
    *,
    stdout: str = "",
    result: str | None = None,
    error: tuple[str, str] | None = None,
    reply: bool = True,
    idle: bool = True,
) -> list[tuple[str, str, dict[str, Any]]]:
    """The messages of one execution: busy, its stream text, its result or error, the reply, idle."""
    messages: list[tuple[str, str, dict[str, Any]]] = [("iopub", "status", {"execution_state": "busy"})]
    if stdout:
        messages.append(("iopub", "stream", {"name": "stdout", "text": stdout}))
    if result is not None:
        messages.append(
            (
                "iopub",
                "execute_result",
                {"data": {"text/plain": result}, "metadata": {}, "execution_count": 1},
            )
        )
    if error is not None:
        ename, evalue = error
        messages.append(
            ("iopub", "error", {"ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]})
        )
    if reply:
        status = {"status": "error", "ename": error[0], "evalue": error[1], "traceback": []} if error else {}
        messages.append(("shell", "execute_reply", {"status": "ok", "execution_count": 1, **status}))
    if idle:
        messages.append(("iopub", "status", {"execution_state": "idle"}))
    return messages


def hangs(code: str) -> list[tuple[str, str, dict[str, Any]]]:
    """A script whose every execution starts and never ends (until interrupted)."""
    return [("iopub", "status", {"execution_state": "busy"})]


def dies(stdout: str = "") -> list[tuple[str, str, dict[str, Any]]]:
    """The messages of an execution during which the kernel's process goes (after ``stdout``)."""
    return [*replies(stdout=stdout, reply=False, idle=False), ("event", "dead", {})]


class FakeKernelConnection:
    """A kernel connection without a kernel: see the module doc. Records what was asked of it."""

    def __init__(
        self,
        script: Script | None = None,
        *,
        kernel_id: str = "fake-kernel",
        on_death: Callable[[], None] | None = None,
    ):
        self.kernel_id = kernel_id
        self.on_death = on_death  # told when the kernel dies (the fake manager marks its kernel dead)
        self.lost_state = False
        self.messages = MessageQueue()
        self.script: Script = script or (lambda code: replies())
        self.alive = True
        self.interrupt_settles = True
        self.started = self.closed = False
        self.executed: list[str] = []
        self.msg_ids: list[str] = []  # of each execute, in order
        self.input_replies: list[str] = []
        self.interrupts = 0
        self.last_msg_id = ""

    async def start(self, ready_timeout: float) -> None:
        self.started = True

    def execute(self, code: str, *, silent: bool = False, store_history: bool = True) -> str:
        if self.closed or not self.alive:
            raise RuntimeError("the fake kernel connection is closed")
        self.last_msg_id = msg_id = uuid4().hex
        self.executed.append(code)
        self.msg_ids.append(msg_id)
        for channel, msg_type, content in self.script(code):
            if (channel, msg_type) == ("event", "dead"):
                self.die()
                break
            self.send(channel, msg_type, content, parent=msg_id)
        return msg_id

    def send(
        self, channel: str, msg_type: str, content: dict[str, Any], *, parent: str | None = None
    ) -> None:
        """Deliver one message, as the kernel would (``parent``: the request it answers, default the last)."""
        parent_id = self.last_msg_id if parent is None else parent
        header = {"msg_id": uuid4().hex, "msg_type": msg_type, "version": "5.3"}
        self.messages.put_nowait(
            {
                "channel": channel,
                "header": header,
                "msg_id": header["msg_id"],
                "msg_type": msg_type,
                "parent_header": {"msg_id": parent_id} if parent_id else {},
                "metadata": {},
                "content": content,
                "buffers": [],
            }
        )

    def input_reply(self, value: str, parent: dict[str, Any]) -> None:
        self.input_replies.append(value)

    async def is_alive(self) -> bool:
        return self.alive

    async def interrupt(self) -> None:
        """What an interrupt of the running execution does to ipykernel's answer (see the module doc)."""
        self.interrupts += 1
        if self.interrupt_settles and self.alive:
            for channel, msg_type, content in replies(error=("KeyboardInterrupt", ""))[1:]:
                self.send(channel, msg_type, content)

    def die(self) -> None:
        """The kernel's process goes: the manager's "dead" notice, as LocalKernelConnection queues it."""
        self.alive = False
        self.messages.put_nowait(event("dead"))
        if self.on_death is not None:
            self.on_death()

    async def close(self) -> None:
        self.closed = True


class FakeKernel:
    """A kernel of :class:`FakeKernelManager`: an id, whether its (imaginary) process runs, and the
    connections made to it. jupyter_client's kernel manager offers the same ``is_alive`` and
    ``stop_restarter``."""

    def __init__(self, kernel_id: str, kernel_name: str, path: str):
        self.kernel_id, self.kernel_name, self.path = kernel_id, kernel_name, path
        self.dead = False
        self.restarter_stopped = False  # our kernel service stops it once the kernel answered
        self.connections: list[FakeKernelConnection] = []

    async def is_alive(self) -> bool:
        return not self.dead

    def exited(self) -> None:
        """Its process went (a connection saw it die)."""
        self.dead = True

    def stop_restarter(self) -> None:
        self.restarter_stopped = True

    def open_connections(self) -> list[FakeKernelConnection]:
        return [c for c in self.connections if not c.closed]


class FakeKernelManager:
    """A fake of jupyter_server's (local) kernel manager: see the module doc. Faults are queued:

    - ``start_faults``: raised by the next ``start_kernel`` calls, one each, in order;
    - ``connect_faults``: raised by the next connects (``RuntimeError("Kernel died before replying")``
      is what jupyter_client says of a kernel that exits before it answers; a ``zmq.ZMQError`` with
      errno EMFILE, what ZMQ raises out of descriptors);
    - ``hold_starts``: while it is an unset event, starts wait for it (a start in progress).

    New connections run ``script``. ``peak`` is the most kernels that ran at once.
    """

    default_kernel_name = "python3"

    def __init__(self, script: Script | None = None, *, root_dir: str | Path = "/"):
        self.script: Script = script or (lambda code: replies())
        self.root_dir = str(root_dir)
        self.kernels: dict[str, FakeKernel] = {}
        self.start_faults: list[BaseException] = []
        self.connect_faults: list[BaseException] = []
        self.hold_starts: asyncio.Event | None = None
        self.starts = 0  # start_kernel calls, failed ones included
        self.started: list[str] = []  # ids of the kernels started, in order
        self.shut_down: list[str] = []
        self.interrupted: list[str] = []
        self.connections: list[FakeKernelConnection] = []  # every connection made, in order
        self.peak = 0
        self.kernel_spec_manager = FakeKernelSpecManager([self.default_kernel_name])

    # -- what the kernel service calls --------------------------------------------------------------

    async def start_kernel(
        self, *, kernel_id: str | None = None, kernel_name: str | None = None, path: str = "", **_: Any
    ) -> str:
        self.starts += 1
        if self.hold_starts is not None:
            await self.hold_starts.wait()
        if self.start_faults:
            raise self.start_faults.pop(0)
        kernel_id = kernel_id or str(uuid4())
        self.kernels[kernel_id] = FakeKernel(kernel_id, kernel_name or self.default_kernel_name, path)
        self.started.append(kernel_id)
        self.peak = max(self.peak, len(self.kernels))
        return kernel_id

    def get_kernel(self, kernel_id: str) -> FakeKernel:
        return self.kernels[kernel_id]  # KeyError, as jupyter_client's

    def __contains__(self, kernel_id: object) -> bool:
        return kernel_id in self.kernels

    def list_kernel_ids(self) -> list[str]:
        return list(self.kernels)

    async def shutdown_kernel(self, kernel_id: str, now: bool = False, **_: Any) -> None:
        kernel = self.kernels.pop(kernel_id)
        kernel.dead = True
        for connection in kernel.connections:  # gone from the manager: a real connection's is_alive says so
            connection.alive = False
        self.shut_down.append(kernel_id)

    async def interrupt_kernel(self, kernel_id: str) -> None:
        self.interrupted.append(kernel_id)
        for connection in self.get_kernel(kernel_id).open_connections():
            await connection.interrupt()

    async def restart_kernel(self, kernel_id: str, now: bool = False, **_: Any) -> None:
        """A new process under the same id: open connections lose their state, as the manager's
        restart callbacks tell a :class:`LocalKernelConnection`."""
        kernel = self.get_kernel(kernel_id)
        kernel.dead = False
        for connection in kernel.open_connections():
            connection.lost_state = True
            connection.messages.put_nowait(event("restarted"))

    def cwd_for_path(self, path: str) -> str:
        return str(Path(self.root_dir, path))

    # -- what FakeKernelService and a test call -----------------------------------------------------

    async def connect(self, kernel_id: str) -> FakeKernelConnection:
        """A new fake connection to a running kernel (a queued connect fault first)."""
        if self.connect_faults:
            raise self.connect_faults.pop(0)
        kernel = self.get_kernel(kernel_id)
        if kernel.dead:
            raise RuntimeError("Kernel died before replying to kernel_info")
        connection = FakeKernelConnection(self.script, kernel_id=kernel_id, on_death=kernel.exited)
        await connection.start(0)
        kernel.connections.append(connection)
        self.connections.append(connection)
        return connection

    def kill(self, kernel_id: str) -> None:
        """The kernel's process goes (no restart): its connections hear it, ``is_alive`` says so."""
        kernel = self.get_kernel(kernel_id)
        for connection in kernel.open_connections():
            if connection.alive:
                connection.die()
        kernel.dead = True

    @property
    def running(self) -> list[str]:
        """Ids of the kernels whose process runs."""
        return [k for k, kernel in self.kernels.items() if not kernel.dead]


class FakeKernelSpecManager:
    """The kernel specs :class:`FakeKernelManager` offers (names only)."""

    def __init__(self, names: list[str]):
        self.names = names

    def find_kernel_specs(self) -> dict[str, str]:
        return {name: f"/fake/kernels/{name}" for name in self.names}


class FakeKernelService(KernelService):
    """The kernel service over a :class:`FakeKernelManager`: everything real but :meth:`connect`, which
    hands out the fake manager's connections instead of ZMQ or websocket clients."""

    async def connect(self, kernel_id: str, ready_timeout: float | None = None) -> KernelConnection:
        manager: FakeKernelManager = self.kernel_manager
        return await manager.connect(kernel_id)
