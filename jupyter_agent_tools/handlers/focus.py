"""``/api/agent/focus``: what the person looks at in JupyterLab, when they share it (:mod:`..focus`).

- ``PUT /api/agent/focus/tabs/{tab}``: the person's browser tab publishes its focus (and heartbeats);
  ``DELETE``: it stops sharing. Only a person: ``write`` on ``agent_focus``, which no agent scope grants
  (``AgentAuthorizer`` refuses agent tokens), and an agent user is refused here too.
- ``GET /api/agent/focus``: an agent reads the focus shared with it (``read`` on ``agent_focus``: the
  ``read`` scope); its paths are checked by the store as every path of a request is.
- ``POST /api/agent/focus/actions``: an agent asks JupyterLab to show the person something, from an
  allow-listed set (``write`` on ``agent_ui``: the ``read`` scope).
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..auth.identity import AgentUser
from ..errors import AgentToolsError
from ..focus import FocusStore
from ..validation import check
from .base import AgentAPIHandler, acting_username

NOT_A_PERSON = (
    "Only the person shares their focus, from their browser (the Agents panel's 'Share my focus'); an agent "
    "token cannot publish or stop it."
)


class _FocusRoute(AgentAPIHandler):
    auth_resource = "agent_focus"

    @property
    def focus(self) -> FocusStore:
        return self.app.focus

    @property
    def agent(self) -> str | None:
        """The caller's agent token name, or None for a person (or the server's own token)."""
        user = self.current_user
        return user.agent if isinstance(user, AgentUser) else None

    def person(self) -> str:
        if self.agent is not None:
            raise AgentToolsError(NOT_A_PERSON, 403)
        return acting_username(self) or ""


class FocusHandler(_FocusRoute):
    """GET: the focus shared with the caller (403 saying how the person shares it when none is)."""

    route_name = "focus"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        await self.write_json(self.focus.read(self.agent))


class FocusTabHandler(_FocusRoute):
    """PUT: a tab's focus (the person's browser); DELETE: the tab stops sharing."""

    route_name = "focus_tab"

    @web.authenticated
    @authorized("write")
    async def put(self, tab: str) -> None:
        person = self.person()
        limit = self.focus.max_publish_bytes
        if len(self.request.body) > limit:
            raise AgentToolsError(
                f"A focus is at most {limit} bytes (FocusStore.max_publish_bytes), got "
                f"{len(self.request.body)}: send the cell without its outputs' data",
                413,
            )
        body: Any = await self.json_body()
        check("FocusPublish", body)
        shared = self.focus.publish(person, tab, body)
        await self.write_json({"tab": shared.tab, "updated": shared.updated, "ttl": self.focus.ttl})

    @web.authenticated
    @authorized("write")
    async def delete(self, tab: str) -> None:
        self.focus.stop(self.person(), tab)
        self.set_status(204)
        self.finish()


class FocusActionHandler(_FocusRoute):
    """POST: an allow-listed UI action of an agent, to the tab sharing its focus with it (else shown as a
    notification)."""

    route_name = "focus_action"
    auth_resource = "agent_ui"

    @web.authenticated
    @authorized("write")
    async def post(self) -> None:
        body: Any = await self.json_body()
        check("FocusAction", body)
        await self.write_json(self.focus.act(self.agent, body))
