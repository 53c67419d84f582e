"""The gate every front door (HTTP route, MCP tool) passes an agent's action through (no Tornado).

:func:`clear` asks the policy; ``allow`` passes at once (nothing is described, nothing is recorded),
``deny`` raises :class:`ApprovalDenied`, ``ask`` describes what would happen exactly (the caller's
``describe``), records a request and waits for the person up to ``wait`` seconds. Approved: the caller
goes on, holding the approval (what it covers is in its details: the caller checks the notebook is still
as the person saw it). Denied, expired or withdrawn: :class:`ApprovalDenied`. Still pending: the approval
is returned pending, and the caller answers 202 and goes on once it is decided (:func:`decided`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..audit.context import set_approver
from ..errors import AgentToolsError, BadRequest, Conflict
from ..stream_events import Emit
from .records import Approval
from .service import ApprovalPolicy

Describe = Callable[[], Awaitable[tuple[str, dict[str, Any]]]]


class ApprovalDenied(AgentToolsError):
    """The person denied the action, nobody decided in time, or a rule denies it (403)."""

    status = 403


@dataclass(frozen=True)
class Asking:
    """Who asks to do what, as the front door derived it from the route (never from the client)."""

    agent: str
    token_ask: frozenset[str]
    door: str
    action: str
    path: str | None  # as the request names it; the gate places it (``ApprovalPolicy.places``)
    also: tuple[str, ...] = ()  # more classes the one action is (a run with ``ops`` edits too)


def described(summary: str, details: dict[str, Any]) -> Describe:
    """A ``describe`` for what is known already."""

    async def describe() -> tuple[str, dict[str, Any]]:
        return summary, details

    return describe


def wait_seconds(body: Any, policy: ApprovalPolicy) -> float:
    """The body's ``approval_wait`` (seconds, up to the policy's timeout), else the policy's ``wait``."""
    raw = body.get("approval_wait") if isinstance(body, dict) else None
    if raw is None:
        return policy.wait
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw <= policy.timeout:
        raise BadRequest(
            f"'approval_wait' must be a number of seconds between 0 and {policy.timeout:g}, got {raw!r}"
        )
    return float(raw)


def query_wait(text: str | None) -> dict[str, float] | None:
    """``?approval_wait=SECONDS`` of a request that has no body (a DELETE), as the body field
    :func:`wait_seconds` reads (None when absent); 400 when it is not a plain number."""
    if text is None:
        return None
    if not re.fullmatch(r"\d{1,7}(\.\d{1,6})?", text.strip()):
        raise BadRequest(f"'approval_wait' must be a number of seconds, got {text[:40]!r}")
    return {"approval_wait": float(text)}


def without_gate_fields(body: Any) -> Any:
    """The body as the service takes it (``approval_wait`` is the gate's)."""
    if isinstance(body, dict) and "approval_wait" in body:
        return {k: v for k, v in body.items() if k != "approval_wait"}
    return body


def refusal(approval: Approval) -> ApprovalDenied:
    """The 403 an agent gets for a request that was denied, expired or withdrawn."""
    extra = {"reason": "approval_denied", "approval_id": approval.id}
    if approval.state == "expired":
        message = f"Nobody decided approval {approval.id} ({approval.summary}) in time. Nothing was done."
    elif approval.state == "withdrawn":
        message = (
            f"Approval {approval.id} ({approval.summary}) was withdrawn: {approval.reason}. Nothing was done."
        )
    else:
        why = f": {approval.reason}" if approval.reason else ""
        message = f"{approval.decided_by or 'The person'} denied {approval.summary}{why}. Nothing was done."
    return ApprovalDenied(message, extra=extra)


async def clear(policy: ApprovalPolicy, asking: Asking, describe: Describe, wait: float) -> Approval | None:
    """None when the action needs nobody's approval; else the approval (approved, or still pending after
    ``wait``). Raises :class:`ApprovalDenied` when denied, expired, withdrawn or denied by a rule."""
    classes = (asking.action, *asking.also)  # an action of several classes: the strictest decision of them
    deciding, found = policy.strictest(asking.agent, classes, asking.path, asking.token_ask)
    if found.decision == "allow":
        return None
    path = policy.placed(asking.path)  # as rules and grants name it: where the file is
    if found.decision == "deny":
        where = f" on {path}" if path is not None else ""
        raise ApprovalDenied(
            f"The server's approval policy denies {asking.agent} the {deciding!r} action{where} "
            f"({found.because}). Nothing was done.",
            extra={"reason": "approval_denied"},
        )
    summary, details = await describe()
    if asking.also:  # one request covers them all (and an "approve for" grant only all of them)
        details = {**details, "actions": [asking.action, *asking.also]}
    approval = await policy.request(
        agent=asking.agent,
        door=asking.door,
        action=asking.action,
        path=path,
        summary=summary,
        details=details,
    )
    await policy.wait_for(approval, wait)
    if approval.state not in ("pending", "approved"):
        raise refusal(approval)
    if approval.state == "approved":
        set_approver(approval.decided_by)
    return approval


async def decided(policy: ApprovalPolicy, approval: Approval) -> Approval:
    """Wait for a pending approval until it is decided or expires; :class:`ApprovalDenied` unless approved."""
    await policy.wait_for(approval, max(0.0, approval.expires - approval.created) + 1.0)
    if approval.state != "approved":
        raise refusal(approval)
    set_approver(approval.decided_by)  # the ledger names who approved the change this work makes
    return approval


async def once_approved(
    policy: ApprovalPolicy,
    approval: Approval,
    emit: Emit,
    cancel: asyncio.Event,
    start: Callable[[], Awaitable[Mapping[str, Any]]],
) -> Mapping[str, Any]:
    """The work of a run that waits for the person (HTTP and MCP alike): an ``approval`` event says it
    waits; once approved another says who approved it and ``start()`` runs. Denied or expired:
    :class:`ApprovalDenied`; cancelled meanwhile: 409, nothing ran, and the request is withdrawn."""
    emit({"type": "approval", "approval_id": approval.id, "state": "pending", "summary": approval.summary})
    waiting = asyncio.ensure_future(decided(policy, approval))
    cancelled = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait((waiting, cancelled), return_when=asyncio.FIRST_COMPLETED)
    finally:
        cancelled.cancel()
    if not waiting.done():
        waiting.cancel()
        policy.withdraw(approval, "the run was cancelled while it waited for the person")
        raise AgentToolsError(
            f"Cancelled while waiting for approval {approval.id}: nothing ran (the request is withdrawn).",
            409,
        )
    waiting.result()  # 403 when denied, expired or withdrawn
    emit(
        {
            "type": "approval",
            "approval_id": approval.id,
            "state": "approved",
            "decided_by": approval.decided_by,
        }
    )
    return await start()


def _plan_key(cell: dict[str, Any]) -> tuple[Any, ...]:
    """What a planned cell is: its id (a cell the run's ops insert, or one without an id: its position,
    a new cell's id being made from the notebook's hash), its type and its source's hash."""
    where = ("@", cell.get("index")) if cell.get("new") or not isinstance(cell.get("id"), str) else cell["id"]
    return (where, cell.get("cell_type"), cell.get("source_hash"))


def changed_cells(approved: list[dict[str, Any]], planned: list[dict[str, Any]]) -> list[str]:
    """How the cells a run would run now (``planned``, as :meth:`NotebookRunner.preview` gives them)
    differ from those the person approved: each approved cell not planned as it was, each planned cell
    not approved, each one whose turn moved; by id (or ``@index``), each once. Empty: the same plan."""
    was, now = [_plan_key(c) for c in approved], [_plan_key(c) for c in planned]
    names = [c for c, key in zip(approved, was, strict=True) if key not in now]
    names += [c for c, key in zip(planned, now, strict=True) if key not in was]
    if not names and was != now:  # the same cells in another order
        names = [c for i, (c, key) in enumerate(zip(planned, now, strict=True)) if was[i : i + 1] != [key]]
        names = names or approved  # (one cell planned twice)
    return list(dict.fromkeys(str(c.get("id") or f"@{c.get('index')}") for c in names))


def still_as_approved(approval: Approval, planned: list[dict[str, Any]]) -> None:
    """409 naming the cells that differ from those the person approved (nothing runs or is written)."""
    changed = changed_cells(approval.details.get("cells") or [], planned)
    if changed:
        raise Conflict(
            f"The notebook changed since approval {approval.id} was given: cell(s) {', '.join(changed)} are "
            "not what the person approved to run (changed, added, removed or moved). Nothing ran; ask again.",
            extra={"approval_id": approval.id, "cells": changed},
        )
