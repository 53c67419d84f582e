"""``/api/agent/approvals``: the requests waiting for the person, and the person's decision.

GET lists (pending first, with a bounded preview of what each would do, then the most recent decided)
and shows one with what it would do in full; an agent sees only its own requests (another's answer 404).
Answers are encoded as JSON in a thread, a request at a time. POST decides: only a person (the server's
own credentials, a logged-in user; on JupyterHub the user in their browser session, or with a token holding
a scope the admin named, :func:`~..auth.hub.decider_refusal`): an agent token is refused (403) whatever its
scopes, by ``AgentAuthorizer`` (no scope grants writing ``agent_approvals``) and again by the service.
"""

from __future__ import annotations

import re
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..approvals import Approval, ApprovalPolicy
from ..auth.hub import decider_refusal
from ..auth.identity import AgentUser
from ..errors import AgentToolsError, BadRequest, NotFound
from ..validation import check
from .base import AgentAPIHandler, acting_person, acting_username

APPROVAL_ID = re.compile(r"[0-9]{1,18}")  # ASCII digits only ('²' and fullwidth digits are no ids)


class _ApprovalRoute(AgentAPIHandler):
    auth_resource = "agent_approvals"

    @property
    def approvals(self) -> ApprovalPolicy:
        return self.app.approval_policy

    @property
    def agent(self) -> str | None:
        """The caller's identity when it is an agent (it sees only its own requests), else None."""
        return acting_username(self) if isinstance(self.current_user, AgentUser) else None

    def visible(self, approval: Approval) -> bool:
        agent = self.agent
        return agent is None or approval.agent == agent

    def approval_id(self, raw: str) -> int:
        if not APPROVAL_ID.fullmatch(raw):
            raise BadRequest(
                f"An approval id is a number (GET /api/agent/approvals lists them), got {raw[:40]!r}"
            )
        return int(raw)


class ApprovalListHandler(_ApprovalRoute):
    """GET: ``{"pending": [...], "recent": [...]}`` (an agent's: its own only); a pending request's
    ``details`` are a preview (``"preview": true`` when cut; GET the request for them in full)."""

    route_name = "approvals"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        recent = await self.approvals.recent(self.agent)
        listing = {
            "pending": [a.to_json(preview_only=True) for a in self.approvals.pending() if self.visible(a)],
            "recent": [a.to_json(with_details=False) for a in recent],
        }
        await self.write_json(listing)


class ApprovalHandler(_ApprovalRoute):
    """GET: one request, with what it would do (code, cells, diff). POST: the person's decision."""

    route_name = "approval"

    @web.authenticated
    @authorized("read")
    async def get(self, approval_id: str) -> None:
        approval = await self.approvals.get(self.approval_id(approval_id))
        if not self.visible(approval):
            raise NotFound(
                f"There is no approval request {approval.id} (GET /api/agent/approvals lists them)."
            )
        await self.write_json(approval.to_json())

    @web.authenticated
    @authorized("write")
    async def post(self, approval_id: str) -> None:
        number = self.approval_id(approval_id)
        refused = decider_refusal(self.current_user, self.approvals.hub_decider_scopes)
        if refused:
            raise AgentToolsError(refused, 403)
        body: Any = await self.json_body()
        check("ApprovalDecision", body)
        approval = await self.approvals.decide(
            number,
            body["decision"],
            by=acting_person(self),
            for_seconds=body.get("for_seconds"),
            reason=body.get("reason"),
        )
        await self.write_json(approval.to_json())
