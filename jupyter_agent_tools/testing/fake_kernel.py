"""A test double of a kernel connection (:class:`jupyter_agent_tools.execution.connection.KernelConnection`).

No kernel process, no ZMQ: :meth:`FakeKernelConnection.execute` puts the Jupyter messages a *script*
returns for the code on the connection's queue at once, shaped as :class:`LocalKernelConnection` delivers
them (decoded, tagged with their channel, ``parent_header`` naming the request). It lets the executor,
recovery and pool logic be unit-tested in milliseconds; what needs a real kernel (its protocol, its
signals, ZMQ's limits) stays in the real-kernel tests.

A script maps the code to a list of ``(channel, msg_type, content)``; :func:`replies` builds the usual
one (busy, output, reply, idle). A script that returns no ``execute_reply`` leaves the execution
running, as a kernel stuck in a loop: :meth:`interrupt` then answers it the way ipykernel does
(``KeyboardInterrupt`` error, error reply, idle) unless ``interrupt_settles`` is False.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import uuid4

from ..execution.connection import MessageQueue, event

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


class FakeKernelConnection:
    """A kernel connection without a kernel: see the module doc. Records what was asked of it."""

    def __init__(self, script: Script | None = None, *, kernel_id: str = "fake-kernel"):
        self.kernel_id = kernel_id
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

    async def close(self) -> None:
        self.closed = True
