"""Which MCP tool calls pass the approval gate, as what action on which notebook (no Tornado).

The same classes of action as the HTTP routes (:mod:`jupyter_agent_tools.approvals.policy`): ``eval`` and
``notebook_run`` execute (a run with ``ops`` edits too: both are decided, in one request),
``notebook_edit`` and ``notebook_undo`` edit, ``notebook_kernel`` with an action and ``session_delete``
act on a kernel. What the person is shown and how an approval binds the call are
:mod:`jupyter_agent_tools.approvals.actions`'s, as for the routes.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..approvals import actions
from ..approvals.gate import Describe
from ..approvals.records import Approval
from ..schemas import is_create_request

if TYPE_CHECKING:
    from .tools import Services


@dataclass(frozen=True)
class ToolGate:
    """What one call must have approved: the action, the notebook, what the person is shown, how the
    call's arguments are bound to what was approved, and whether it can go on as a detached run."""

    action: str
    path: str | None
    describe: Describe
    bind: Callable[[Approval], Awaitable[dict[str, Any]]]
    detachable: bool = False  # eval and notebook runs: still pending, they go on as a run awaiting approval
    also: tuple[str, ...] = ()  # more classes of action the call is (a run with ops edits too)


def _path(arguments: dict[str, Any]) -> str | None:
    path = arguments.get("path")
    return path if isinstance(path, str) else None


def gate_of(name: str, services: Services, arguments: dict[str, Any]) -> ToolGate | None:
    """The gate a call of tool ``name`` passes, or None (reads, lists, interrupts)."""

    async def same(_approval: Approval) -> dict[str, Any]:
        return arguments

    path = _path(arguments)
    if name == "eval":
        notebook = arguments.get("notebook")
        return ToolGate(
            "execute",
            notebook if isinstance(notebook, str) else None,
            functools.partial(actions.describe_eval, arguments),
            same,
            detachable=True,
        )
    if name == "notebook_run" and path is not None:
        body = {k: v for k, v in arguments.items() if k != "path"}
        runner = services.notebook_runner

        async def bind_run(approval: Approval) -> dict[str, Any]:
            return {"path": path, **await actions.bind_run(runner, approval, path, body)}

        describe = functools.partial(actions.describe_run, runner, path, body)
        return ToolGate("execute", path, describe, bind_run, True, also=actions.run_also(body))
    if name == "notebook_edit" and path is not None:
        body = {k: v for k, v in arguments.items() if k != "path"}
        creating = is_create_request(body)

        async def bind_edit(approval: Approval) -> dict[str, Any]:
            bound = await actions.bind_edit(services.notebook_store, approval, path, body)
            return {"path": path, **bound}

        describe = functools.partial(actions.describe_edit, services.notebook_store, path, body, creating)
        return ToolGate("edit", path, describe, bind_edit)
    if name == "notebook_undo" and path is not None:
        change_id = str(arguments.get("change_id"))
        describe = functools.partial(actions.describe_undo, services.notebook_store, path, change_id)
        return ToolGate("edit", path, describe, same)
    if name == "notebook_kernel" and path is not None and arguments.get("action") is not None:
        return ToolGate("kernel", path, actions.describe_kernel_action(path, arguments), same)
    if name == "session_delete":
        return ToolGate("kernel", None, actions.describe_session_delete(arguments.get("name")), same)
    return None
