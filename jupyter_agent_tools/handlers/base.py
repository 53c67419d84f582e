"""The base of every agent route: JSON bodies, service errors mapped to JSON HTTP errors."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Awaitable, Callable
from http.client import responses
from typing import TYPE_CHECKING, Any, cast

from jupyter_core.utils import ensure_async
from jupyter_server.auth.authorizer import Authorizer
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from jupyter_server.utils import url_path_join
from tornado import web

from ..approvals import Approval, ApprovalPolicy
from ..approvals.gate import Asking, Describe, clear, wait_seconds, without_gate_fields
from ..audit import NO_AUDIT, Audit, set_user
from ..audit.context import OWNER_NAME, current_via, display_name, set_token, set_via
from ..auth.context import set_agent, set_paths
from ..auth.identity import AgentUser
from ..body import decode_off_loop, encode_answer
from ..compat import cached_user
from ..errors import AgentToolsError

if TYPE_CHECKING:
    from ..app import AgentToolsApp  # the application imports the handlers: only for the type

# The header a client sends to say which program it is; "cli" is recorded as such in the change ledger.
CLIENT_HEADER = "X-Agent-Client"

NO_CREDENTIALS = (
    "This route needs the server's token: send it as the header 'Authorization: token <TOKEN>' (the token "
    "`python3 dev.py serve` or `jupyter server list` prints), or log in with a browser."
)
WRONG_CREDENTIALS = (
    "The token sent with this request is not accepted by this server (wrong, expired or revoked). Send the "
    "server's token as the header 'Authorization: token <TOKEN>' (the token `python3 dev.py serve` or "
    "`jupyter server list` prints)."
)


def username(user: Any) -> str | None:
    """The username jupyter_server resolved for a request (``User.username``), or None."""
    name = getattr(user, "username", None)
    return name if isinstance(name, str) else None


def acting_username(handler: APIHandler) -> str | None:
    """Who is acting, for session owners, audit events and metrics.

    jupyter_server makes a new anonymous user with a random name for every request authenticated by the
    server's own token (it keeps no cookie): such requests are one principal, named ``token-`` and the
    first 8 hex digits of the token's SHA-256 (stable, and the token cannot be recovered from it). Any
    other user is named as jupyter_server resolved it (a JupyterHub user, a password login, a browser).
    """
    user = handler.current_user
    name = username(user)
    provider = handler.identity_provider
    server_token = getattr(provider, "token", "")
    if (
        name is not None
        and handler.token_authenticated
        and str(getattr(user, "name", "")).startswith("Anonymous ")
        and server_token
        and provider.get_token(handler) == server_token
    ):
        return "token-" + hashlib.sha256(server_token.encode()).hexdigest()[:8]
    return name


def acting_person(handler: APIHandler) -> str:
    """How the acting user is named to others (who decided an approval): the holder of the server's own
    token, or anyone it or the server's password logged in (jupyter_server's anonymous users), is "the
    server's owner", never the token's hash or a random username; anyone else (an agent, a JupyterHub
    user) by their username. The identity key stays :func:`acting_username`."""
    name = acting_username(handler)
    if not isinstance(handler.current_user, AgentUser) and (
        name is None or str(getattr(handler.current_user, "name", "")).startswith("Anonymous ")
    ):
        return OWNER_NAME
    return display_name(name) or OWNER_NAME


class _AuditedAuthorizer:
    """The server's authorizer, asked as it is, recording each refusal (:meth:`Audit.refused`)."""

    def __init__(self, inner: Authorizer, handler: AgentAPIHandler):
        self._inner = inner
        self._handler = handler

    async def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        allowed = bool(await ensure_async(self._inner.is_authorized(handler, user, action, resource)))
        if not allowed:
            me = self._handler
            me.audit.refused(
                route=me.route_name,
                method=me.request.method or "",
                action=action,
                resource=resource,
                user=acting_username(me) if user is me.current_user else username(user),
            )
        return allowed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class AgentAPIHandler(ExtensionHandlerMixin, APIHandler):
    """JSON API handler of the jupyter_agent_tools extension.

    ``route_name`` names the route in metrics labels and audit events (never the request path).
    """

    route_name = "unknown"
    via = "http"  # the front door, as the change ledger records it (``cli`` when the client says so)

    @property
    def app(self) -> AgentToolsApp:
        """The extension application, typed: the one way a handler reaches its services and limits."""
        return cast("AgentToolsApp", self.extensionapp)

    @property
    def audit(self) -> Audit:
        return getattr(self.extensionapp, "audit", None) or NO_AUDIT

    @property
    def authorizer(self) -> Authorizer:
        return cast("Authorizer", _AuditedAuthorizer(super().authorizer, self))

    async def prepare(self) -> None:  # type: ignore[override]
        """The server's own preparation (authentication), then the request's user becomes the acting
        user of the services (:mod:`jupyter_agent_tools.audit.context`), and an agent token's path globs
        the paths they may reach (:mod:`jupyter_agent_tools.auth.context`).

        Every agent route needs a user: a request without valid credentials is refused here, with a
        message that says how to pass the token (jupyter_server's own refusal is a bare ``Forbidden``,
        and an ``'_xsrf' argument missing`` on POST)."""
        try:
            await super().prepare()
        except web.HTTPError as e:
            if e.status_code == 403 and self._unauthenticated():
                raise web.HTTPError(403, self._credentials_problem()) from None
            raise
        if self.current_user is None:  # the server allows unauthenticated access; these routes do not
            raise web.HTTPError(403, self._credentials_problem())
        set_user(acting_username(self))
        set_token(getattr(self.current_user, "token_id", None) or None)  # what a revocation ends
        # an agent token's path globs (None for everyone else): the services check each path they get
        set_paths(getattr(self.current_user, "path_scope", None))
        set_agent(isinstance(self.current_user, AgentUser))  # an agent sees only its own and its paths'
        set_via("cli" if self.request.headers.get(CLIENT_HEADER, "").lower() == "cli" else self.via)

    def _unauthenticated(self) -> bool:
        """True once authentication ran and found no user (not a refused Host header)."""
        return cached_user(self, True) is None and self.check_host()

    def _credentials_problem(self) -> str:
        sent = self.request.headers.get("Authorization") or self.get_argument("token", "")
        return WRONG_CREDENTIALS if sent else NO_CREDENTIALS

    def check_xsrf_cookie(self) -> None:
        # A request nobody is logged in for is refused in prepare() with what to fix about the token;
        # checking XSRF first would answer "'_xsrf' argument missing", sending a wrong token astray.
        # Requests of a logged-in browser keep the XSRF check.
        if cached_user(self, True) is None:
            return None
        return super().check_xsrf_cookie()

    def on_finish(self) -> None:
        status = self.get_status()
        if 400 <= status < 500:
            self.audit.request_error(self.route_name, status)
        super().on_finish()

    @property
    def approval_policy(self) -> ApprovalPolicy:
        return self.app.approval_policy

    async def approval(
        self, action: str, path: str | None, describe: Describe, body: Any, also: tuple[str, ...] = ()
    ) -> Approval | None:
        """Pass the approval gate for ``action`` (the route's class of action; ``also``: more classes the
        call is) on ``path``: None when no approval is needed, else the approval (approved, or still
        pending: answer 202). 403 when denied."""
        asking = Asking(
            agent=acting_username(self) or "",
            token_ask=getattr(self.current_user, "ask", frozenset()),
            door=current_via() or self.via,
            action=action,
            path=path,
            also=also,
        )
        return await clear(self.approval_policy, asking, describe, wait_seconds(body, self.approval_policy))

    async def respond_gated(
        self,
        action: str,
        path: str | None,
        describe: Describe,
        gate_body: Any,
        apply: Callable[[Any], Awaitable[tuple[Any, int]]],
        bind: Callable[[Approval, Any], Awaitable[Any]] | None = None,
    ) -> None:
        """The gated action's one flow on the routes that answer once: ``apply(body)`` (its answer and
        status; the body without the gate's fields) once the gate lets it through, after ``bind`` (what
        the person saw checked against now, the body to apply) when the person was asked; when the person
        has not decided within the wait, 202 now and the same once approved. ``describe()`` is asked only
        when the person is asked."""
        body = without_gate_fields(gate_body)
        approval = await self.approval(action, path, describe, gate_body)

        async def approved(given: Approval) -> tuple[Any, int]:
            return await apply(await bind(given, body) if bind is not None else body)

        if approval is not None and approval.state == "pending":
            self.approval_policy.when_approved(approval, functools.partial(approved, approval))
            await self.write_pending(approval)
            return
        answer, status = await (apply(body) if approval is None else approved(approval))
        if answer is None:
            self.set_status(status)
            self.finish()
        else:
            await self.write_json(answer, status)

    async def write_pending(self, approval: Approval, **extra: Any) -> None:
        """202: the action waits for the person (``Location``: the approval); it goes on once approved."""
        location = url_path_join(self.base_url, "api/agent/approvals", str(approval.id))
        self.set_header("Location", location)
        await self.write_json(
            {
                "approval_id": approval.id,
                "state": "awaiting_approval",
                "location": location,
                "message": f"Waiting for the person to approve {approval.summary} (approval {approval.id} in "
                "JupyterLab's Agents panel); it is done once approved. GET the location to see its state.",
                **extra,
            },
            status=202,
        )

    @property
    def max_body_bytes(self) -> int:
        return int(getattr(self.extensionapp, "max_body_bytes", 0) or 0)

    async def json_body(self) -> Any:
        """The request body parsed as JSON, or a 4xx that says what is wrong with it (see
        :func:`decode_json_body`). A large body is parsed in a thread, so the server keeps answering
        everyone else meanwhile."""
        return await decode_off_loop(self.request.body, self.max_body_bytes)

    async def write_json(self, data: Any, status: int = 200) -> None:
        """Answer ``data`` as JSON; a large answer is encoded in a thread (see :func:`encode_answer`)."""
        text = await encode_answer(data)
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(text)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """JSON errors; a service's :class:`AgentToolsError` answers its own status and message.

        Tornado sends any exception that is not an ``HTTPError`` here as a 500; the status is corrected
        before anything is written (public API only: ``set_status``/``write_error``).
        """
        exc_info = kwargs.get("exc_info")
        error = exc_info[1] if exc_info else None
        if not isinstance(error, AgentToolsError):
            super().write_error(status_code, **kwargs)
            return
        self.clear()  # Tornado clears headers before write_error; start from a clean slate anyway
        self.set_status(error.status)
        self.set_header("Content-Type", "application/json")
        if error.retry_after:
            self.set_header("Retry-After", str(error.retry_after))
        reply = {"message": error.message, "reason": responses.get(error.status, ""), **error.extra}
        self.log.warning("wrote error: %r", error.message)
        self.finish(json.dumps(reply, ensure_ascii=False))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        """An expected service error is a caller's mistake or a busy server, not a server bug."""
        if isinstance(value, AgentToolsError):
            request = self.request
            self.log.warning("%d %s %s: %s", value.status, request.method, request.uri, value.message)
            return
        super().log_exception(typ, value, tb)
