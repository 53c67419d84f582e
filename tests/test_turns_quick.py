"""Calls take turns on a session (``KernelSession.take_turn``/``end_turn``, driven by the eval service),
over a fake kernel manager: one call at a time in arrival order, a waiting or starting call cancelled, a
session deleted, evicted or swept around its calls. One quick test per case of the real-kernel tests in
tests/test_eval.py and test_session_safety.py (each names its counterpart).

Cells named ``hold…`` run until the test ends them (:func:`finish`); others print ``ran <code>``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fake_stack import until

from jupyter_agent_tools.errors import Unavailable
from jupyter_agent_tools.testing.fake_kernel import FakeKernelConnection, hangs, replies

pytestmark = pytest.mark.quick  # no server, no kernel

INIT = "def __agent_tools_init"


class Holding:
    """The script of the module doc; ``started`` is set when a ``hold…`` cell starts."""

    def __init__(self) -> None:
        self.started = asyncio.Event()

    def __call__(self, code: str) -> list[tuple[str, str, dict[str, Any]]]:
        if code.startswith("hold"):
            self.started.set()
            return hangs(code)
        return replies(stdout="" if code.startswith(INIT) else f"ran {code}\n")

    async def running(self) -> None:
        """Wait until a ``hold…`` cell runs (and expect the next one)."""
        await self.started.wait()
        self.started.clear()


def finish(connection: FakeKernelConnection, code: str) -> None:
    """The kernel ends the running ``code`` (printing ``ran <code>``)."""
    parent = connection.msg_ids[connection.executed.index(code)]
    for channel, msg_type, content in replies(stdout=f"ran {code}\n")[1:]:
        connection.send(channel, msg_type, content, parent=parent)


def cells_run(connection: FakeKernelConnection) -> list[str]:
    return [code for code in connection.executed if not code.startswith(INIT)]


async def test_queue_order_on_one_session(stacks):
    """test_eval.py::test_queue_order_on_one_session"""
    script = Holding()
    stack = stacks(script)
    first = asyncio.ensure_future(stack.eval("hold"))
    await script.running()
    session = stack.sessions.get("s")
    calls = []
    for i in range(1, 6):
        calls.append(asyncio.ensure_future(stack.eval(f"c{i}")))
        await until(lambda i=i: session.waiting == i, f"call {i} waiting")
    assert session.busy and session.describe()["queue_depth"] == 5
    connection = stack.connection()
    assert cells_run(connection) == ["hold"]  # nothing else runs while a call holds the session
    finish(connection, "hold")
    answers = await asyncio.gather(first, *calls)
    assert [a["output"] for a in answers] == ["ran hold\n", *(f"ran c{i}\n" for i in range(1, 6))]
    assert cells_run(connection) == ["hold", "c1", "c2", "c3", "c4", "c5"]  # in the order they came
    assert session.idle and not session.busy


async def test_two_first_calls_create_one_kernel(stacks):
    """test_eval.py::test_two_first_calls_create_one_kernel"""
    stack = stacks(Holding())
    a, b = await asyncio.gather(stack.eval("1", session="twin"), stack.eval("2", session="twin"))
    assert a["kernel_id"] == b["kernel_id"] and stack.manager.starts == 1


async def test_a_waiting_call_cancelled_leaves_its_turn_and_runs_nothing(stacks):
    """No real-kernel counterpart that cancels a waiting call (tests/test_session_state.py checks
    ``take_turn`` alone); test_eval.py::test_client_disconnect_interrupts cancels a running one."""
    script = Holding()
    stack = stacks(script)
    first = asyncio.ensure_future(stack.eval("hold"))
    await script.running()
    session = stack.sessions.get("s")
    gone = asyncio.Event()
    leaving = asyncio.ensure_future(stack.eval("never", cancel=gone))
    staying = asyncio.ensure_future(stack.eval("later"))
    await until(lambda: session.waiting == 2, "two waiting calls")
    gone.set()
    left = await leaving
    assert left["cancelled"] is True and left["cells"] == []
    assert left["output"] == "(cancelled before it started)" and session.waiting == 1
    finish(stack.connection(), "hold")
    assert (await first)["output"] == "ran hold\n" and (await staying)["output"] == "ran later\n"
    assert cells_run(stack.connection()) == ["hold", "later"]


async def test_session_listing_delete_and_interrupt(stacks):
    """test_eval.py::test_session_listing_delete_and_interrupt"""
    script = Holding()
    stack = stacks(script)
    first = await stack.eval("1", session="work")
    running = asyncio.ensure_future(stack.eval("hold", session="work"))
    await script.running()
    (entry,) = stack.service.list_sessions()
    assert entry["busy"] is True and entry["running_cell"] == {"index": 0, "cell_id": None, "of": 1}
    answer = await stack.service.interrupt_session("work")
    assert answer["interrupted"] is True
    result = await running
    assert result["cancelled"] is True and result["timed_out"] is False
    assert stack.manager.interrupted == [first["kernel_id"]]  # the kernel was interrupted, not replaced
    assert (await stack.eval("after", session="work"))["kernel_id"] == first["kernel_id"]
    await stack.service.delete_session("work")
    assert stack.manager.list_kernel_ids() == [] and stack.service.list_sessions() == []


async def test_delete_during_run_leaves_no_kernel(stacks):
    """test_eval.py::test_delete_during_run_leaves_no_kernel"""
    script = Holding()
    stack = stacks(script)
    await stack.eval("1", session="gone")
    running = asyncio.ensure_future(stack.eval("hold", session="gone"))
    await script.running()
    waiting = asyncio.ensure_future(stack.eval("queued", session="gone"))
    await until(lambda: stack.sessions.get("gone").waiting == 1, "the queued call")
    await stack.service.delete_session("gone")
    assert (await running)["cancelled"] is True
    queued = await waiting  # it runs on a fresh session of the same name, and is told so
    assert queued["session_lost"]["reason"] == "deleted"
    assert queued["output"].endswith("this call runs in a new kernel.]\nran queued\n")
    await stack.service.delete_session("gone")
    assert stack.manager.list_kernel_ids() == []


@pytest.mark.parametrize("phase", ["launch", "init"])
@pytest.mark.parametrize("mode", ["per-call", "session"])
async def test_a_delete_while_the_kernel_starts_cancels_the_call(stacks, phase, mode):
    """test_session_safety.py::test_a_delete_while_the_kernel_starts_cancels_the_call"""
    starting = asyncio.Event()

    def script(code: str) -> list[tuple[str, str, dict[str, Any]]]:
        if code.startswith(INIT):  # the init step of a kernel that is up: it never ends here
            starting.set()
            return hangs(code)
        return replies(stdout=f"ran {code}\n")

    stack = stacks(script)
    if phase == "launch":
        stack.manager.hold_starts = asyncio.Event()
    fields: dict[str, Any] = {"mode": "per-call"} if mode == "per-call" else {"session": "starting"}
    call = asyncio.ensure_future(stack.eval("never", **fields))
    if phase == "launch":
        await until(lambda: stack.manager.starts == 1, "the kernel's start")
    else:
        await starting.wait()
    (entry,) = stack.service.list_sessions()
    await stack.service.delete_session(entry["name"])
    result = await call  # at once: the start goes on without the call
    assert result["cancelled"] is True and result["error"] is None and "never" not in result["output"]
    if stack.manager.hold_starts is not None:
        stack.manager.hold_starts.set()
    await until(lambda: stack.manager.started and not stack.manager.list_kernel_ids(), "the kernel's end")
    assert stack.manager.connections and not any("never" in c.executed for c in stack.manager.connections)


async def test_an_interrupt_while_the_kernel_starts_cancels_the_call(stacks):
    """test_session_safety.py::test_an_interrupt_while_the_kernel_starts_cancels_the_call"""
    stack = stacks(Holding())
    stack.manager.hold_starts = asyncio.Event()
    call = asyncio.ensure_future(stack.eval("never", session="early"))
    await until(lambda: stack.manager.starts == 1, "the kernel's start")
    assert (await stack.service.interrupt_session("early"))["interrupted"] is True
    result = await call  # answered while the kernel still starts
    assert result["cancelled"] is True and result["cells"] == []
    assert result["output"] == "(cancelled before it started)"
    stack.manager.hold_starts.set()
    after = await stack.eval("1 + 1", session="early")
    assert after["output"] == "ran 1 + 1\n" and after["kernel_id"] == stack.manager.started[0]
    assert cells_run(stack.connection("early")) == ["1 + 1"]  # the cancelled call's cell never ran


async def test_all_sessions_busy_answers_503(stacks):
    """test_eval.py::test_all_sessions_busy_answers_503"""
    script = Holding()
    stack = stacks(script, max_sessions=2)
    slow = [asyncio.ensure_future(stack.eval("hold", session=name)) for name in ("p", "q")]
    holding = stack.manager.connections
    await until(lambda: sum("hold" in c.executed for c in holding) == 2, "two cells held")
    with pytest.raises(Unavailable, match="busy") as refused:
        await stack.eval("1", session="r")
    assert refused.value.status == 503 and refused.value.retry_after
    for name in ("p", "q"):
        finish(stack.connection(name), "hold")
    assert [a["output"] for a in await asyncio.gather(*slow)] == ["ran hold\n"] * 2


async def test_concurrent_sessions_and_lru_eviction(stacks):
    """test_eval.py::test_concurrent_sessions_and_lru_eviction"""
    stack = stacks(Holding(), max_sessions=2)
    a, b = await asyncio.gather(stack.eval("a", session="a"), stack.eval("b", session="b"))
    assert a["kernel_id"] != b["kernel_id"]
    await stack.eval("touch a", session="a")
    c = await stack.eval("c", session="c")  # evicts b, the least recently used
    assert sorted(s["name"] for s in stack.service.list_sessions()) == ["a", "c"]
    assert stack.sessions.totals["evictions"] == 1
    assert b["kernel_id"] in stack.manager.shut_down and c["kernel_id"] in stack.manager.list_kernel_ids()


async def test_evictions_never_exceed_max_sessions_kernels(stacks):
    """test_session_safety.py::test_evictions_never_exceed_max_sessions_kernels"""
    stack = stacks(Holding(), max_sessions=2)
    await stack.eval("1", session="a")
    await stack.eval("1", session="b")
    answers = await asyncio.gather(
        *(stack.eval("1", session=f"new{i}") for i in range(6)), return_exceptions=True
    )
    assert all(isinstance(a, (dict, Unavailable)) for a in answers), answers
    assert any(isinstance(a, dict) for a in answers)
    assert stack.manager.peak <= 2, f"{stack.manager.peak} kernels at once with max_sessions=2"


async def test_a_session_that_went_says_so_to_its_next_call(stacks):
    """test_eval.py::test_a_session_that_went_says_so_to_its_next_call (and ::test_idle_sweep)"""
    stack = stacks(Holding(), max_sessions=2)
    await stack.eval("x = 1", session="a")
    await stack.eval("y = 1", session="b")
    await stack.eval("1", session="c")  # evicts a
    again = await stack.eval("x", session="a")  # evicts b
    assert (
        again["session_lost"]["reason"] == "evicted" and "max_sessions=2" in again["session_lost"]["message"]
    )
    assert again["output"].startswith("[Session 'a' was evicted to make room for session 'c'")
    assert (await stack.eval("1", session="a"))["session_lost"] is None  # told once
    kernel = stack.sessions.get("a").kernel_id
    stack.sessions.idle_timeout = 1e-9
    await stack.sessions.sweep()
    stack.sessions.idle_timeout = 300.0
    assert stack.sessions.get("a") is None and kernel in stack.manager.shut_down
    assert stack.sessions.totals["idle_shutdowns"] == 2  # a and c
    culled = await stack.eval("1", session="a")
    assert culled["session_lost"]["reason"] == "idle" and "idle_timeout" in culled["output"]
    await stack.service.delete_session("a")
    deleted = await stack.eval("1", session="a")
    assert deleted["session_lost"]["reason"] == "deleted" and "was deleted" in deleted["output"]
    assert (await stack.eval("1", session="fresh"))["session_lost"] is None
