"""The one cell loop's discipline (issue 47): it calls its hooks always, and when it stops is data
(:class:`StopRules`), not which hooks a caller passed. Over the fake kernel (quick tier)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jupyter_agent_tools.execution.cells import Cell, CellHooks, Ran, StopRules, Told
from jupyter_agent_tools.execution.kernel_session import KernelSession
from jupyter_agent_tools.testing.fake_kernel import replies

pytestmark = pytest.mark.quick


def fails_on(bad: str) -> Any:
    def script(code: str) -> list[tuple[str, str, dict[str, Any]]]:
        return replies(error=("ValueError", "no")) if code == bad else replies(stdout=f"{code}\n")

    return script


class Recorded:
    """The hooks a test passes, noting every call."""

    def __init__(self) -> None:
        self.not_run: list[int] = []
        self.after: list[int] = []

    def hooks(self, **fields: Any) -> CellHooks:
        recorded = self

        class Policy:
            async def after(
                self, session: KernelSession, ran: Ran, reruns: int, cancel: asyncio.Event
            ) -> Told | None:
                recorded.after.append(ran.cell.index)
                return None

        return CellHooks(not_run=lambda cell: self.not_run.append(cell.index), policy=Policy(), **fields)


async def loop_over(stacks: Any, codes: list[str], **options: Any) -> tuple[Any, list[Any]]:
    stack = stacks(fails_on("bad"))
    await stack.eval("warm")  # the session "s" and its kernel
    session = stack.sessions.get("s")
    events: list[Any] = []
    loop = asyncio.get_running_loop()
    options.setdefault("deadline", loop.time() + 5)
    run = await stack.service.cells.run_cells(
        session,
        [Cell(i, code, None) for i, code in enumerate(codes)],
        emit=events.append,
        cancel=options.pop("cancel", asyncio.Event()),
        timeout=5,
        pace=None,
        **options,
    )
    return run, events


async def test_the_cells_after_a_failure_go_to_not_run_by_default_rules(stacks: Any) -> None:
    recorded = Recorded()
    run, events = await loop_over(stacks, ["a", "bad", "c", "d"], hooks=recorded.hooks())
    assert [r.cell.index for r in run.ran] == [0, 1]
    assert recorded.not_run == [2, 3]  # called for each cell not started, whoever the caller is
    assert recorded.after == [0, 1]  # the policy after every cell that ran
    assert [e["index"] for e in events if e["type"] == "cell_start"] == [0, 1]


async def test_on_error_false_runs_every_cell(stacks: Any) -> None:
    recorded = Recorded()
    run, _ = await loop_over(
        stacks, ["a", "bad", "c"], hooks=recorded.hooks(), rules=StopRules(on_error=False)
    )
    assert [r.execution.status for r in run.ran] == ["complete", "error", "complete"]
    assert recorded.not_run == []


async def test_at_deadline_starts_no_cell_past_it_and_names_them(stacks: Any) -> None:
    recorded = Recorded()
    past = asyncio.get_running_loop().time() - 1
    run, events = await loop_over(
        stacks, ["a", "b"], hooks=recorded.hooks(), rules=StopRules(at_deadline=True), deadline=past
    )
    assert run.ran == [] and recorded.not_run == [0, 1] and events == []


async def test_without_at_deadline_a_late_cell_still_starts(stacks: Any) -> None:
    # eval's rules and the loop's own run_cell: the cell is started (a real kernel's would then time out
    # at once, and the answer says so; the fake kernel answers first)
    past = asyncio.get_running_loop().time() - 1
    run, events = await loop_over(stacks, ["a"], deadline=past)
    assert [r.cell.index for r in run.ran] == [0]
    assert [e["type"] for e in events if e["type"].startswith("cell_")] == ["cell_start", "cell_end"]


async def test_a_cancelled_call_starts_nothing_whatever_the_rules(stacks: Any) -> None:
    recorded = Recorded()
    cancel = asyncio.Event()
    cancel.set()
    run, _ = await loop_over(
        stacks, ["a", "b"], hooks=recorded.hooks(), rules=StopRules(on_error=False), cancel=cancel
    )
    assert run.ran == [] and recorded.not_run == [0, 1]


async def test_a_run_cell_hook_runs_each_cell_and_names_its_count(stacks: Any) -> None:
    seen: list[tuple[int, int]] = []
    stack_holder: dict[str, Any] = {}

    async def run_cell(cell: Cell, position: int, emit: Any) -> Any:
        seen.append((cell.index, position))
        execution = await stack_holder["cells"].execute(
            stack_holder["session"],
            cell.code,
            index=cell.index,
            deadline=1e18,
            timeout=5,
            cancel=asyncio.Event(),
            emit=emit,
        )
        return execution, 40 + position

    stack = stacks(fails_on("bad"))
    await stack.eval("warm")
    stack_holder.update(cells=stack.service.cells, session=stack.sessions.get("s"))
    events: list[Any] = []
    run = await stack.service.cells.run_cells(
        stack_holder["session"],
        [Cell(7, "x", None, "id-x", notebook=True), Cell(9, "y", None, "id-y", notebook=True)],
        emit=events.append,
        cancel=asyncio.Event(),
        deadline=asyncio.get_running_loop().time() + 5,
        timeout=5,
        pace=None,
        hooks=CellHooks(run_cell=run_cell),
    )
    assert seen == [(7, 0), (9, 1)] and len(run.ran) == 2
    ends = [e for e in events if e["type"] == "cell_end"]
    assert [(e["cell_id"], e["execution_count"]) for e in ends] == [("id-x", 40), ("id-y", 41)]
