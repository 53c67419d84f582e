"""The MCP server: JSON-RPC dispatch for the Streamable HTTP transport, in both protocol eras. Pure: the
Tornado handler (:mod:`jupyter_agent_tools.handlers.mcp`) parses HTTP and writes what this returns.

- Legacy era (2024-11-05 to 2025-11-25): ``initialize`` negotiates the version and opens a session
  (``Mcp-Session-Id``, bound to the authenticated user, ended by DELETE); ``notifications/cancelled``
  cancels a running call of the session; 2025-03-26 sessions may send JSON-RPC batches.
- Modern era (2026-07-28): no handshake and no session; every request carries its version and client
  capabilities in ``params._meta``, mirrored in the ``MCP-Protocol-Version``, ``Mcp-Method`` and
  ``Mcp-Name`` headers; ``server/discover`` names the supported versions; closing the response cancels.

A request is answered with one JSON object, or, when it sends progress or runs longer than the heartbeat
interval, with an SSE stream: the handler decides from the first item of :attr:`Answer.stream`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import contextvars
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from ..approvals.gate import Asking, clear, once_approved, refusal, wait_seconds, without_gate_fields
from ..approvals.records import Approval
from ..audit.context import current_token, current_user, set_approver
from ..body import encode_answer
from ..errors import AgentToolsError
from ..execution.dispatch import extra_permissions
from ..focus import FOCUS_URI
from ..runs.registry import Viewer
from ..stream_events import Emit
from ..streaming import TaskSource, pump
from ..validation import short_repr
from .gates import ToolGate, gate_of
from .jsonrpc import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RESOURCE_NOT_FOUND,
    UNSUPPORTED_PROTOCOL_VERSION,
    Message,
    RequestId,
    RpcError,
    error_message,
    is_request_id,
    notification,
    parse_message,
    result_message,
)
from .request_state import ApprovalState, InvalidRequestState, RequestStates, arguments_digest
from .resources import TEMPLATES, ResourceNotFound, list_resources, read_focus, read_resource
from .tools import (
    FOCUS_TOOLS,
    TOOLS,
    Services,
    Tool,
    ToolCall,
    ToolResult,
    focus_permissions,
    resolve_focus,
    service_call,
    tool_state,
    wait_or_cancelled,
)

LEGACY_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")  # oldest first
MODERN_VERSIONS = ("2026-07-28",)
VERSIONS = (*LEGACY_VERSIONS, *MODERN_VERSIONS)
BATCH_VERSIONS = ("2025-03-26",)  # JSON-RPC batches came in 2025-03-26 and went in 2025-06-18
PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SESSION_HEADER, VERSION_HEADER = "mcp-session-id", "mcp-protocol-version"
METHOD_HEADER, NAME_HEADER = "mcp-method", "mcp-name"
NAMED_METHODS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
RESOURCE_METHODS = ("resources/list", "resources/read", "resources/templates/list")
# resources/subscribe: jupyter://focus only (legacy sessions; the updates come on the session's GET stream;
# 2026-07-28: subscriptions/listen)
CAPABILITIES = {"tools": {"listChanged": False}, "resources": {"subscribe": True, "listChanged": False}}
SUBSCRIBE_METHODS = ("resources/subscribe", "resources/unsubscribe")
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"  # stamped in a listen stream's frames
# notifications kept for a stream not read yet; older ones go (an update is an update)
MAX_WAITING_UPDATES = 16
CACHE_TTL_MS = 5 * 60 * 1000  # tools/list and server/discover change only with the server's version
# What a 2026-07-28 client may cache of each resources/* answer (the revision requires both fields): the
# templates are fixed, notebooks change at any time; all depend on who asks (an agent token's paths).
RESOURCE_CACHING = {
    "resources/templates/list": {"ttlMs": CACHE_TTL_MS, "cacheScope": "private"},
    "resources/list": {"ttlMs": 0, "cacheScope": "private"},
    "resources/read": {"ttlMs": 0, "cacheScope": "private"},
}
MAX_SESSIONS = 1000  # legacy sessions kept; the least recently used goes first
SESSION_IDLE_SECONDS = 24 * 3600.0
TASK_VERSION = "2025-11-25"  # tasks came in 2025-11-25 (the 2026-07-28 era has none here)
TASK_METHODS = ("tasks/get", "tasks/result", "tasks/cancel", "tasks/list")
RELATED_TASK_KEY = "io.modelcontextprotocol/related-task"
TASK_POLL_MS = 1000
# A task's status from its run's state (a tool error is a failed task; stopped by its timeout or an
# interrupt: cancelled).
TASK_STATUS = {
    "queued": "working",
    "awaiting_approval": "input_required",  # the person decides in JupyterLab (the approval gate)
    "running": "working",
    "complete": "completed",
    "error": "failed",
    "cancelled": "cancelled",
    "interrupted": "cancelled",
    "timed_out": "cancelled",
    "lost": "failed",
}
MAX_PROGRESS_CHARS = 16_000  # one progress message; the result still has the whole (tail-kept) output
# HTTP status of a modern-era JSON-RPC error answered as JSON (the 2026-07-28 transport's table).
MODERN_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}
INSTRUCTIONS = (
    "Tools of a Jupyter server. Find notebooks with file_list; read one with notebook_read and change it "
    "cell by cell with notebook_edit, passing the hash you read as expected_hash. Run Python with eval: "
    "state persists per session name. A truncated output's full text is read with artifact_read."
)


def at_least(version: str, minimum: str) -> bool:
    return VERSIONS.index(version) >= VERSIONS.index(minimum)


def decode_header_value(value: str | None) -> str | None:
    """A header value as sent: ``=?base64?...?=`` is UTF-8 in base64 (2026-07-28); None if malformed."""
    if value is None or not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    try:
        return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


@dataclass
class HttpRequest:
    """What the transport knows about one HTTP request."""

    headers: Mapping[str, Sequence[str]]  # lower-case names, every value of each
    user: str  # whom a legacy session belongs to
    authorize: Callable[[str, str], Awaitable[bool]]  # (action, resource): the server's authorizer
    identity: str = ""  # the acting user, as the approval gate's rules name it (agent:NAME)
    agent: str | None = None  # the agent token's name (None: not an agent): whose shared focus it sees
    token_ask: frozenset[str] = frozenset()  # what an agent token asks the person for (--ask)
    lab_url: str = ""  # JupyterLab on this server, as the client reached it (an approval's page)
    # (action, resource) pairs -> the WWW-Authenticate challenge when the caller's OAuth token lacks a
    # scope they need (its client may sign in again for more: 403 insufficient_scope), else None
    scope_challenge: Callable[[list[tuple[str, str]]], str | None] | None = None

    def header(self, name: str) -> str | None:
        values = self.headers.get(name)
        return values[0] if values else None


@dataclass
class Outgoing:
    """One message of a response: a notification, the final response, or None for a keep-alive."""

    message: dict[str, Any] | None
    final: bool = False
    status: int = 200  # when the final response is the whole answer (not streamed)


@dataclass
class Answer:
    """An HTTP answer: ``body`` as JSON (None: no body; bytes: already encoded), or ``stream`` for the
    handler to send."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    stream: AsyncIterator[Outgoing] | None = None
    cancel: asyncio.Event | None = None  # set it when the client goes away


@dataclass
class _Call:
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    by_client: bool = False  # cancelled by notifications/cancelled: the response is not sent


@dataclass
class _Outbox:
    """Server-initiated messages waiting for a stream (a legacy session's GET stream, a 2026-07-28
    ``subscriptions/listen`` response), bounded: an update is an update, the oldest go first."""

    messages: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_WAITING_UPDATES))
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.wake.set()


@dataclass(eq=False)  # (kept in a set: one per listen stream)
class _FocusWatch:
    """A subscription to ``jupyter://focus``: the subscribing request's context (its agent token's paths,
    which the focus store checks), the agent, what it saw last, where its updates go (with ``meta`` in
    their params: a listen stream's subscription id) and, for a listen stream, what ends it."""

    context: contextvars.Context
    agent: str | None
    last: tuple[str, int] | None
    outbox: _Outbox
    meta: dict[str, Any] | None = None
    cancel: asyncio.Event | None = None


@dataclass
class LegacySession:
    id: str
    user: str
    version: str
    last_used: float
    initialized: bool = False
    calls: dict[RequestId, _Call] = field(default_factory=dict)
    focus: _FocusWatch | None = None
    # server-initiated messages for the session's GET stream (one stream at a time: ``listening``)
    outbox: _Outbox = field(default_factory=_Outbox)
    listening: asyncio.Event | None = None


class _Progress:
    """Text for ``notifications/progress``, coalesced while the client is being written to, and bounded:
    a client that reads slower than the kernel prints gets the latest text (the result has it all)."""

    def __init__(self, token: RequestId | None):
        self.token = token
        self.parts: list[str] = []
        self.size = 0
        self.dropped = 0
        self.count = 0
        self.ready = asyncio.Event()

    def push(self, text: str) -> None:
        if self.token is None or not text:
            return
        self.parts.append(text)
        self.size += len(text)
        if self.size > 2 * MAX_PROGRESS_CHARS:
            joined = "".join(self.parts)
            self.dropped += len(joined) - MAX_PROGRESS_CHARS
            self.parts, self.size = [joined[-MAX_PROGRESS_CHARS:]], MAX_PROGRESS_CHARS
        self.ready.set()

    def take(self) -> dict[str, Any]:
        text = "".join(self.parts)
        cut = self.dropped + max(0, len(text) - MAX_PROGRESS_CHARS)
        self.parts, self.size, self.dropped = [], 0, 0
        self.ready.clear()
        if cut:
            text = f"[... {cut} characters not shown here]\n{text[-MAX_PROGRESS_CHARS:]}"
        return self._notification(text)

    def heartbeat(self) -> dict[str, Any] | None:
        """Progress without a message while the call is silent; None (an SSE comment) without a token."""
        return None if self.token is None else self._notification(None)

    def _notification(self, message: str | None) -> dict[str, Any]:
        self.count += 1
        params: dict[str, Any] = {"progressToken": self.token, "progress": self.count}
        if message is not None:
            params["message"] = message
        return notification("notifications/progress", params)


class McpServer:
    """MCP over the extension's services: one instance per Jupyter server (it holds legacy sessions)."""

    def __init__(
        self,
        services: Services,
        *,
        tools: Sequence[Tool] = TOOLS,
        heartbeat_interval: float,
        max_batch_items: int,
        max_batch_answer_bytes: int,
        max_sessions_per_identity: int,
        log: logging.Logger | None = None,
    ):
        """The limits are the application's validated ``stream_heartbeat_interval`` and ``mcp_*`` traits."""
        self.services = services
        self.tools = {tool.name: tool for tool in tools}
        self.heartbeat_interval = heartbeat_interval
        self.max_batch_items = max_batch_items
        self.max_batch_answer_bytes = max_batch_answer_bytes
        self.max_sessions_per_identity = max_sessions_per_identity
        self.log = log or logging.getLogger(__name__)
        self.sessions: OrderedDict[str, LegacySession] = OrderedDict()
        self._tool_lists: dict[str, list[dict[str, Any]]] = {}
        self._states = RequestStates()
        self._listens: set[_FocusWatch] = set()  # the 2026-07-28 listen streams open on jupyter://focus
        focus = getattr(services, "focus", None)
        if focus is not None:
            focus.on_change(self._focus_changed)

    # -- HTTP methods --------------------------------------------------------------------------------

    async def post(self, body: Any, request: HttpRequest) -> Answer:
        """Answer a POST whose body parsed as JSON."""
        try:
            if isinstance(body, list):
                return await self._batch(body, request)
            if isinstance(body, dict) and self._is_modern(body, request):
                return await self._modern(body, request)
            return await self._legacy(body, request)
        except RpcError as e:
            return Answer(e.status, e.to_message())

    @staticmethod
    def body_error(status: int, message: str) -> Answer:
        """The answer to a body that is not JSON (-32700), or too large (-32600 with 413)."""
        code = INVALID_REQUEST if status == 413 else PARSE_ERROR
        return Answer(status, error_message(None, code, message))

    def get(self, request: HttpRequest) -> Answer:
        """A legacy session's stream of server-initiated messages (the ``notifications/resources/updated``
        of its subscriptions), as SSE; one at a time per session (a new one ends the previous one)."""
        if request.header(SESSION_HEADER) is None:
            message = (
                "Method Not Allowed: GET opens a session's stream of updates (send initialize first, then "
                "GET with its Mcp-Session-Id); every other message is an answer to a POST"
            )
            return Answer(405, error_message(None, INVALID_REQUEST, message), {"Allow": "POST, DELETE"})
        try:
            session = self._session(request, None)
        except RpcError as e:
            return Answer(e.status, e.to_message())
        if "text/event-stream" not in (request.header("accept") or ""):
            message = "Not Acceptable: a session's GET stream is text/event-stream (send Accept with it)"
            return Answer(406, error_message(None, INVALID_REQUEST, message))
        if session.listening is not None:
            session.listening.set()
        cancel = session.listening = asyncio.Event()
        return Answer(200, stream=self._listen(session, cancel), cancel=cancel)

    async def _listen(self, session: LegacySession, cancel: asyncio.Event) -> AsyncIterator[Outgoing]:
        """The session's waiting messages as they come, a keep-alive each heartbeat interval, until the
        client goes, another GET replaces this one or the session ends."""
        yield Outgoing(None)  # the stream is open (the client sees its headers now)
        async for item in self._drain(
            session.outbox, cancel, lambda: self.sessions.get(session.id) is session
        ):
            yield item

    async def _drain(
        self, outbox: _Outbox, cancel: asyncio.Event, alive: Callable[[], bool]
    ) -> AsyncIterator[Outgoing]:
        """``outbox``'s messages as they come, a keep-alive each heartbeat interval, until ``cancel`` is set
        or ``alive()`` is no longer true."""
        while not cancel.is_set() and alive():
            if outbox.messages:
                yield Outgoing(outbox.messages.popleft())
                continue
            outbox.wake.clear()
            waiters = [asyncio.ensure_future(outbox.wake.wait()), asyncio.ensure_future(cancel.wait())]
            try:
                done, _ = await asyncio.wait(
                    waiters, timeout=self.heartbeat_interval, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for waiter in waiters:
                    waiter.cancel()
            if not done:
                yield Outgoing(None)

    def _focus_watches(self) -> list[_FocusWatch]:
        legacy = [s.focus for s in self.sessions.values() if s.focus is not None]
        return legacy + list(self._listens)

    def _focus_changed(self) -> None:
        """A tab's focus changed: each subscription to ``jupyter://focus`` whose agent now sees something
        else than it saw is sent ``notifications/resources/updated`` (others never hear of it)."""
        focus = self.services.focus
        for watch in self._focus_watches():
            now = watch.context.run(focus.signature, watch.agent)
            if now == watch.last:
                continue
            watch.last = now
            params: dict[str, Any] = {"uri": FOCUS_URI}
            if watch.meta is not None:
                params["_meta"] = watch.meta
            watch.outbox.put(notification("notifications/resources/updated", params))

    def end_token(self, token_id: str) -> None:
        """An agent token ended (revoked, expired): the focus subscriptions it made end, and their streams
        close (the token can open no new one)."""
        for session in self.sessions.values():
            watch = session.focus
            if watch is not None and watch.context.run(current_token) == token_id:
                session.focus = None
                if session.listening is not None:
                    session.listening.set()
        for watch in list(self._listens):
            if watch.context.run(current_token) == token_id and watch.cancel is not None:
                watch.cancel.set()

    async def _listen_modern(self, msg: Message, request: HttpRequest) -> Answer:
        """``subscriptions/listen`` (2026-07-28): an SSE stream that acknowledges what it honors (of
        ``resourceSubscriptions``: ``jupyter://focus``; nothing else changes here), then sends
        ``notifications/resources/updated`` for it, until the client closes it."""
        wanted = msg.params.get("notifications")
        uris = wanted.get("resourceSubscriptions") if isinstance(wanted, dict) else None
        if not isinstance(wanted, dict) or not (
            uris is None or (isinstance(uris, list) and all(isinstance(u, str) for u in uris))
        ):
            raise RpcError(
                INVALID_PARAMS,
                "Invalid params: 'notifications' must be an object (a SubscriptionFilter), its "
                "'resourceSubscriptions' a list of URIs",
                id=msg.id,
            )
        if "text/event-stream" not in (request.header("accept") or ""):
            raise RpcError(
                INVALID_REQUEST, "Invalid Request: subscriptions/listen answers text/event-stream", id=msg.id
            )
        honored: dict[str, Any] = {}
        meta = {SUBSCRIPTION_ID_KEY: msg.id}
        cancel = asyncio.Event()
        watch = None
        if FOCUS_URI in (uris or ()):
            await self._authorize(msg, request, "read", "agent_focus", "the person's shared focus")
            honored["resourceSubscriptions"] = [FOCUS_URI]
            context = contextvars.copy_context()
            last = context.run(self.services.focus.signature, request.agent)
            watch = _FocusWatch(context, request.agent, last, _Outbox(), meta, cancel)
        return Answer(200, stream=self._listen_stream(watch, honored, meta, cancel), cancel=cancel)

    async def _listen_stream(
        self, watch: _FocusWatch | None, honored: dict[str, Any], meta: dict[str, Any], cancel: asyncio.Event
    ) -> AsyncIterator[Outgoing]:
        acknowledged = {"notifications": honored, "_meta": meta}
        yield Outgoing(notification("notifications/subscriptions/acknowledged", acknowledged))
        outbox = watch.outbox if watch is not None else _Outbox()
        if watch is not None:
            self._listens.add(watch)
        try:
            async for item in self._drain(outbox, cancel, lambda: True):
                yield item
        finally:
            if watch is not None:
                self._listens.discard(watch)

    async def _subscribe(self, msg: Message, request: HttpRequest, session: LegacySession) -> dict[str, Any]:
        """``resources/subscribe`` and ``resources/unsubscribe``: ``jupyter://focus`` only."""
        uri = msg.params.get("uri")
        if not isinstance(uri, str):
            raise RpcError(INVALID_PARAMS, "Invalid params: 'uri' must be a string", id=msg.id)
        if uri != FOCUS_URI:
            raise RpcError(
                INVALID_PARAMS,
                f"Invalid params: this server sends updates of {FOCUS_URI} only; read a notebook again "
                "for its changes",
                id=msg.id,
            )
        if msg.method == "resources/unsubscribe":
            session.focus = None
            return {}
        await self._authorize(msg, request, "read", "agent_focus", "the person's shared focus")
        context = contextvars.copy_context()  # this request's agent paths: checked at each change
        last = context.run(self.services.focus.signature, request.agent)
        session.focus = _FocusWatch(context, request.agent, last, session.outbox)
        return {}

    @staticmethod
    async def _authorize(msg: Message, request: HttpRequest, action: str, resource: str, what: str) -> None:
        try:
            allowed = await request.authorize(action, resource)
        except AgentToolsError as e:
            raise RpcError(INVALID_REQUEST, f"Permission denied: {e.message}", id=msg.id) from None
        if not allowed:
            raise RpcError(
                INVALID_REQUEST,
                f"Permission denied: User is not authorized to {action} on resource: {resource} ({what}); "
                "nothing was read.",
                id=msg.id,
            )

    def delete(self, request: HttpRequest) -> Answer:
        """End a legacy session: its running calls are cancelled."""
        try:
            session = self._session(request, None)
        except RpcError as e:
            return Answer(e.status, e.to_message())
        for call in session.calls.values():
            call.by_client = True
            call.cancel.set()
        if session.listening is not None:
            session.listening.set()
        self.sessions.pop(session.id, None)
        return Answer(204)

    # -- eras ----------------------------------------------------------------------------------------

    @staticmethod
    def _is_modern(body: dict[str, Any], request: HttpRequest) -> bool:
        if body.get("method") == "initialize":
            return False  # an initialize selects the legacy era, whatever it carries
        version = request.header(VERSION_HEADER)
        if version is not None and version not in LEGACY_VERSIONS:
            return True
        params = body.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        return isinstance(meta, dict) and PROTOCOL_VERSION_KEY in meta

    async def _legacy(self, body: Any, request: HttpRequest) -> Answer:
        msg = parse_message(body)
        if msg.kind == "request" and msg.method == "initialize":
            try:
                return self._initialize(msg, request)
            except RpcError as e:  # a method's error is an ordinary JSON-RPC answer in this era
                return Answer(200, e.to_message())
        session = self._session(request, msg.id)
        header = request.header(VERSION_HEADER)
        if header is not None and header != session.version:
            raise RpcError(
                INVALID_REQUEST,
                f"Bad Request: MCP-Protocol-Version {short_repr(header)} is not the version this session "
                f"negotiated ({session.version})",
                id=msg.id,
            )
        if msg.kind != "request":
            self._legacy_notification(msg, session)
            return Answer(202)
        return await self._legacy_request(msg, request, session)

    async def _legacy_request(self, msg: Message, request: HttpRequest, session: LegacySession) -> Answer:
        try:
            if msg.method == "ping":
                return Answer(200, result_message(msg.id, {}))
            if msg.method == "tools/list":
                return Answer(200, result_message(msg.id, self._tools_list(msg, session.version, False)))
            if msg.method == "tools/call":
                return self._tools_call(msg, request, session.version, session)
            if msg.method in RESOURCE_METHODS:
                return Answer(200, result_message(msg.id, await self._resources(msg, request)))
            if msg.method in SUBSCRIBE_METHODS:
                return Answer(200, result_message(msg.id, await self._subscribe(msg, request, session)))
            if msg.method in TASK_METHODS and session.version == TASK_VERSION:
                return self._task_method(msg, session)
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {short_repr(msg.method)}", id=msg.id)
        except RpcError as e:  # a method's error is an ordinary JSON-RPC answer in this era
            return Answer(200, e.to_message())

    def _legacy_notification(self, msg: Message, session: LegacySession) -> None:
        if msg.kind == "response":
            return  # answers to server requests: this server sends none
        if not msg.method.startswith("notifications/"):
            raise RpcError(INVALID_REQUEST, f"Invalid Request: {short_repr(msg.method)} needs an 'id'")
        if msg.method == "notifications/initialized":
            session.initialized = True
        elif msg.method == "notifications/cancelled":
            rid = msg.params.get("requestId")
            call = session.calls.get(rid) if isinstance(rid, (str, int)) else None
            if call is not None:
                call.by_client = True
                call.cancel.set()

    async def _modern(self, body: dict[str, Any], request: HttpRequest) -> Answer:
        msg = parse_message(body)
        if msg.kind == "response":
            raise RpcError(INVALID_REQUEST, "Invalid Request: clients send requests and notifications only")
        if msg.kind == "notification":
            if not msg.method.startswith("notifications/"):
                raise RpcError(INVALID_REQUEST, f"Invalid Request: {short_repr(msg.method)} needs an 'id'")
            version = request.header(VERSION_HEADER)
            if version is not None and version not in VERSIONS:
                raise self._unsupported(version, None)
            # No notification means anything on this wire: a client cancels by closing the response.
            return Answer(202)
        try:
            version = self._envelope(msg, request)
            if msg.method == "server/discover":
                return Answer(200, result_message(msg.id, self._discover()))
            if msg.method == "tools/list":
                return Answer(200, result_message(msg.id, self._tools_list(msg, version, True)))
            if msg.method == "tools/call":
                return self._tools_call(msg, request, version, None)
            if msg.method in RESOURCE_METHODS:
                result = {**await self._resources(msg, request), **RESOURCE_CACHING[msg.method]}
                return Answer(200, result_message(msg.id, self._modern_result(result)))
            if msg.method == "subscriptions/listen":
                return await self._listen_modern(msg, request)
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {short_repr(msg.method)}", id=msg.id)
        except RpcError as e:
            return Answer(MODERN_STATUS.get(e.code, 200), e.to_message())

    def _envelope(self, msg: Message, request: HttpRequest) -> str:
        """Check a modern request's ``_meta`` and mirrored headers; its protocol version."""
        meta = msg.params.get("_meta")
        if (
            not isinstance(meta, dict)
            or PROTOCOL_VERSION_KEY not in meta
            or CLIENT_CAPABILITIES_KEY not in meta
        ):
            raise RpcError(
                INVALID_PARAMS,
                f"Invalid params: params._meta must carry {PROTOCOL_VERSION_KEY!r} and "
                f"{CLIENT_CAPABILITIES_KEY!r} (protocol 2026-07-28), or send initialize first (earlier ones)",
                id=msg.id,
            )
        version = meta[PROTOCOL_VERSION_KEY]
        for name in (VERSION_HEADER, METHOD_HEADER, NAME_HEADER):
            if len(request.headers.get(name, ())) > 1:
                raise RpcError(HEADER_MISMATCH, f"Header mismatch: {name} appears more than once", id=msg.id)
        mismatch = None
        if request.header(VERSION_HEADER) != version:
            mismatch = "MCP-Protocol-Version header does not match params._meta's protocol version"
        elif request.header(METHOD_HEADER) != msg.method:
            mismatch = "Mcp-Method header does not match the request's method"
        elif msg.method in NAMED_METHODS:
            key = NAMED_METHODS[msg.method]
            value = msg.params.get(key)
            if value is not None and decode_header_value(request.header(NAME_HEADER)) != value:
                mismatch = f"Mcp-Name header does not match the request's {key!r}"
        if mismatch is not None:
            raise RpcError(HEADER_MISMATCH, f"Header mismatch: {mismatch}", id=msg.id)
        if not isinstance(version, str):
            raise RpcError(INVALID_PARAMS, "Invalid params: the protocol version must be a string", id=msg.id)
        if version not in MODERN_VERSIONS:
            raise self._unsupported(version, msg.id)
        return version

    @staticmethod
    def _unsupported(requested: str, rid: RequestId | None) -> RpcError:
        data = {"supported": list(reversed(VERSIONS)), "requested": requested}
        return RpcError(UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version", data=data, id=rid)

    async def _batch(self, items: list[Any], request: HttpRequest) -> Answer:
        """Answer a batch item by item, yielding to the event loop between items; refused whole when it
        has more than ``max_batch_items`` messages; once its answers take more than
        ``max_batch_answer_bytes``, the requests left are answered with an error, not run."""
        if not items:
            raise RpcError(INVALID_REQUEST, "Invalid Request: an empty batch")
        session = self._session(request, None)
        if session.version not in BATCH_VERSIONS:
            raise RpcError(
                INVALID_REQUEST,
                f"Invalid Request: JSON-RPC batches are not part of protocol {session.version} (only "
                f"{', '.join(BATCH_VERSIONS)}); send one message per POST",
            )
        limit = self.max_batch_items
        if len(items) > limit:
            raise RpcError(
                INVALID_REQUEST,
                f"Invalid Request: a batch of {len(items)} messages; this server takes at most {limit} in "
                f"one batch (mcp_max_batch_items). Nothing was run: send them in batches of at most "
                f"{limit}, or one message per POST",
            )
        answers: list[bytes] = []  # each answer encoded once, as it comes: its size is known
        size = 0
        for item in items:
            if size > self.max_batch_answer_bytes:
                answer = self._batch_item_not_run(item, session, size)
            else:
                answer = await self._batch_item(item, request, session)
            if answer is not None:
                answers.append((await encode_answer(answer)).encode())
                size += len(answers[-1])
            await asyncio.sleep(0)  # other requests are served between items
        return Answer(200, b"[" + b",".join(answers) + b"]") if answers else Answer(202)

    async def _batch_item(
        self, item: Any, request: HttpRequest, session: LegacySession
    ) -> dict[str, Any] | None:
        """One message of a batch: its response, or None for a notification."""
        try:
            msg = parse_message(item)
            if msg.kind != "request":
                self._legacy_notification(msg, session)
                return None
            if msg.method == "initialize":
                raise RpcError(INVALID_REQUEST, "Invalid Request: initialize cannot be batched", id=msg.id)
            answer = await self._legacy_request(msg, request, session)
        except RpcError as e:
            return e.to_message()
        if answer.stream is None:
            response: dict[str, Any] | None = answer.body
            return response
        response = None
        async for item_out in answer.stream:  # progress is not sent in a batch; only the response
            if item_out.final and item_out.message is not None:
                response = item_out.message
        return response

    def _batch_item_not_run(self, item: Any, session: LegacySession, size: int) -> dict[str, Any] | None:
        """A request after the batch's answers outgrew ``max_batch_answer_bytes``: an error saying so.
        Notifications still take effect (they add nothing to the answer)."""
        try:
            msg = parse_message(item)
            if msg.kind != "request":
                self._legacy_notification(msg, session)
                return None
        except RpcError as e:
            return e.to_message()
        return error_message(
            msg.id,
            INVALID_REQUEST,
            f"Invalid Request: not run: the batch's answer is too large (the answers before this request "
            f"take {size} bytes; this server answers at most {self.max_batch_answer_bytes} bytes per "
            f"batch, mcp_max_batch_answer_bytes); send this request again in another batch or alone",
        )

    # -- methods -------------------------------------------------------------------------------------

    def _server_info(self, version: str) -> dict[str, Any]:
        info: dict[str, Any] = {"name": "jupyter-agent-tools", "version": __version__}
        if at_least(version, "2025-06-18"):
            info["title"] = "Jupyter agent tools"
        return info

    def _modern_result(self, result: dict[str, Any], result_type: str = "complete") -> dict[str, Any]:
        return {
            **result,
            "resultType": result_type,
            "_meta": {SERVER_INFO_KEY: self._server_info(MODERN_VERSIONS[-1])},
        }

    def _initialize(self, msg: Message, request: HttpRequest) -> Answer:
        requested = msg.params.get("protocolVersion")
        if not isinstance(requested, str):
            raise RpcError(INVALID_PARAMS, "Invalid params: 'protocolVersion' must be a string", id=msg.id)
        for key in ("capabilities", "clientInfo"):
            if key in msg.params and not isinstance(msg.params[key], dict):
                raise RpcError(INVALID_PARAMS, f"Invalid params: {key!r} must be an object", id=msg.id)
        # The requested version if we speak it, else our newest: the client decides whether it can go on.
        version = requested if requested in LEGACY_VERSIONS else LEGACY_VERSIONS[-1]
        session = self._open_session(request.user, version)
        capabilities: dict[str, Any] = dict(CAPABILITIES)
        if version == TASK_VERSION:
            capabilities["tasks"] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
        result = {
            "protocolVersion": version,
            "capabilities": capabilities,
            "serverInfo": self._server_info(version),
            "instructions": INSTRUCTIONS,
        }
        return Answer(200, result_message(msg.id, result), {"Mcp-Session-Id": session.id})

    def _discover(self) -> dict[str, Any]:
        return self._modern_result(
            {
                "supportedVersions": list(reversed(VERSIONS)),
                "capabilities": dict(CAPABILITIES),  # as initialize's (subscribe: subscriptions/listen here)
                "instructions": INSTRUCTIONS,
                "ttlMs": CACHE_TTL_MS,
                "cacheScope": "private",
            }
        )

    def _tools_list(self, msg: Message, version: str, modern: bool) -> dict[str, Any]:
        if msg.params.get("cursor") is not None:
            raise RpcError(
                INVALID_PARAMS, "Invalid params: unknown cursor (the list has one page)", id=msg.id
            )
        tools = self._tool_lists.get(version)
        if tools is None:
            tools = self._tool_lists[version] = [
                self._tool_json(tool, version) for tool in self.tools.values()
            ]
        if modern:
            return self._modern_result({"tools": tools, "ttlMs": CACHE_TTL_MS, "cacheScope": "private"})
        return {"tools": tools}

    @staticmethod
    def _tool_json(tool: Tool, version: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": tool.name,
            "description": tool.description,
            "inputSchema": tool.input_schema,
        }
        if at_least(version, "2025-03-26"):
            out["annotations"] = {"title": tool.title, **tool.annotations}
        if at_least(version, "2025-06-18"):
            out["title"] = tool.title
            if tool.output_schema is not None:
                out["outputSchema"] = tool.output_schema
        if version == TASK_VERSION and tool.task_support is not None:
            out["execution"] = {"taskSupport": tool.task_support}
        return out

    async def _resources(self, msg: Message, request: HttpRequest) -> dict[str, Any]:
        """``resources/list``, ``resources/read``, ``resources/templates/list`` (see :mod:`.resources`):
        reading notebooks, so the caller needs ``read`` on ``contents`` as the notebook_read tool does."""
        if msg.method == "resources/templates/list":
            return {"resourceTemplates": TEMPLATES}
        if msg.method == "resources/read" and msg.params.get("uri") == FOCUS_URI:
            await self._authorize(msg, request, "read", "agent_focus", "the person's shared focus")
            try:
                return read_focus(self.services, request.agent)
            except AgentToolsError as e:
                raise RpcError(INVALID_PARAMS, e.message, id=msg.id) from None
        try:
            allowed = await request.authorize("read", "contents")
        except AgentToolsError as e:
            raise RpcError(INVALID_REQUEST, f"Permission denied: {e.message}", id=msg.id) from None
        if not allowed:
            raise RpcError(
                INVALID_REQUEST,
                "Permission denied: User is not authorized to read on resource: contents (resources are "
                "notebooks); nothing was read.",
                id=msg.id,
            )
        try:
            if msg.method == "resources/list":
                cursor = msg.params.get("cursor")
                if cursor is not None and not isinstance(cursor, str):
                    raise RpcError(INVALID_PARAMS, "Invalid params: 'cursor' must be a string", id=msg.id)
                return await list_resources(self.services, cursor)
            uri = msg.params.get("uri")
            if not isinstance(uri, str):
                raise RpcError(INVALID_PARAMS, "Invalid params: 'uri' must be a string", id=msg.id)
            return await read_resource(self.services, uri)
        except ResourceNotFound as e:
            raise RpcError(RESOURCE_NOT_FOUND, e.message, data={"uri": e.uri}, id=msg.id) from None
        except AgentToolsError as e:
            if e.status == 404:
                uri = str(msg.params.get("uri", ""))[:200]
                raise RpcError(RESOURCE_NOT_FOUND, e.message, data={"uri": uri}, id=msg.id) from None
            raise RpcError(INVALID_PARAMS, e.message, id=msg.id) from None

    def _tools_call(
        self, msg: Message, request: HttpRequest, version: str, session: LegacySession | None
    ) -> Answer:
        name = msg.params.get("name")
        if not isinstance(name, str):
            raise RpcError(
                INVALID_PARAMS, "Invalid params: 'name' must be a string (a tool's name)", id=msg.id
            )
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(self.tools)
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {short_repr(name)} (tools: {known})", id=msg.id)
        arguments = msg.params.get("arguments")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: 'arguments' must be an object", id=msg.id)
        assert msg.id is not None
        if request.scope_challenge is not None:
            extra = _extra_permissions(tool, arguments)
            value = request.scope_challenge([*tool.permissions, *extra])
            if value is not None:
                message = (
                    f"Forbidden: the {tool.name} tool needs a scope this app's sign-in did not grant; "
                    "sign in again to ask the person for it (insufficient_scope). Nothing was done."
                )
                return Answer(
                    403, error_message(msg.id, INVALID_REQUEST, message), {"WWW-Authenticate": value}
                )
        if session is not None and msg.id in session.calls:
            raise RpcError(INVALID_REQUEST, f"Invalid Request: id {msg.id!r} is already in use", id=msg.id)
        task = msg.params.get("task")
        if task is not None and version == TASK_VERSION:
            return self._tools_call_as_task(msg.id, tool, arguments, task, request)
        meta = msg.params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        call = _Call()
        progress = _Progress(token if is_request_id(token) else None)
        resumed = _Resumed.of(msg.params) if session is None else None
        run = self._run_tool(tool, arguments, version, request, call, progress, resumed)
        stream = self._stream(msg.id, run, progress, call, session, modern=session is None)
        return Answer(200, stream=stream, cancel=call.cancel)

    async def _run_tool(
        self,
        tool: Tool,
        arguments: dict[str, Any],
        version: str,
        request: HttpRequest,
        call: _Call,
        progress: _Progress,
        resumed: _Resumed | None = None,
    ) -> dict[str, Any]:
        arguments, refused = await self._allowed(tool, arguments, request, version)
        if refused is not None:
            return refused
        passed, answer = await self._gate(
            tool, arguments, request, version, call.cancel, progress.push, resumed=resumed
        )
        if answer is not None:
            return answer
        return await self._execute(tool, passed, version, call.cancel, progress.push, request.authorize)

    async def _gate(
        self,
        tool: Tool,
        arguments: dict[str, Any],
        request: HttpRequest,
        version: str,
        cancel: asyncio.Event,
        progress: Callable[[str], None],
        *,
        until_decided: bool = False,
        resumed: _Resumed | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The approval gate (:mod:`.gates`): the arguments to run with, or the call's answer instead (a
        denial, or a request still pending after the wait). While it waits, progress says so.
        ``until_decided``: wait as long as the request lives (a task, which the client polls).

        Still pending, a 2026-07-28 call (``resumed``: its retry fields) is answered input-required: a
        URL-mode elicitation opens JupyterLab at the request, and the client retries with the state,
        which only the approval's own state can clear (never what the client answers). An earlier
        client's call goes on once approved, without this call."""
        if not tool.gated:
            return arguments, None
        policy = self.services.approval_policy
        given = arguments  # (a 2026-07-28 retry's state is bound to the arguments as sent)
        try:
            wait = wait_seconds(arguments, policy)  # the gate's argument, checked as the routes check it
        except AgentToolsError as e:
            return arguments, self._call_result(ToolResult(e.message, is_error=True), version)
        arguments = without_gate_fields(arguments)
        gate = gate_of(tool.name, self.services, arguments)
        if gate is None:
            return arguments, None
        asking = Asking(request.identity, request.token_ask, "mcp", gate.action, gate.path, gate.also)
        try:
            if resumed is not None and resumed.state is not None:
                cleared: Approval | None = await self._resume(resumed, tool, given, request)
            else:
                cleared = await clear(policy, asking, gate.describe, 0)
            if cleared is None:
                return arguments, None
            approval = cleared
            if approval.state == "pending" and resumed is not None and resumed.declined:
                policy.withdraw(approval, f"the agent's client did not open it ({resumed.declined})")
                raise AgentToolsError(
                    f"The client did not open approval {approval.id} ({resumed.declined}): nothing was "
                    "done, and the request is withdrawn (call the tool again to ask anew).",
                    409,
                )
            if approval.state == "pending":
                progress(f"Waiting for approval {approval.id} in JupyterLab: {approval.summary}\n")
                seconds = approval.expires - time.time() + 1.0 if until_decided else wait
                await wait_or_cancelled(policy.wait_for(approval, seconds), cancel)
            if approval.state not in ("pending", "approved"):
                raise refusal(approval)
            if approval.state == "pending" and resumed is not None:
                return arguments, self._input_required(approval, tool, given, request, resumed)
            if approval.state == "pending":
                return arguments, self._call_result(self._go_on_when_approved(tool, gate, approval), version)
            if resumed is not None and resumed.state is not None and not policy.claim(approval):
                raise AgentToolsError(
                    f"Approval {approval.id} was used by an earlier call already: nothing was done again.",
                    409,
                )
            progress(f"Approved by {approval.decided_by}.\n")
            set_approver(approval.decided_by)  # the ledger names who approved the change
            return await gate.bind(approval), None
        except AgentToolsError as e:
            return arguments, self._call_result(ToolResult(e.message, is_error=True), version)

    async def _resume(
        self, resumed: _Resumed, tool: Tool, arguments: dict[str, Any], request: HttpRequest
    ) -> Approval:
        """The approval a retried 2026-07-28 call continues, from its echoed (checked) state."""
        try:
            state = self._states.unseal(
                resumed.state, owner=request.user, tool=tool.name, arguments=arguments
            )
        except InvalidRequestState as e:
            raise RpcError(
                INVALID_PARAMS,
                f"Invalid params: 'requestState' is {e}; call the tool again without it",
            ) from None
        return await self.services.approval_policy.get(state.approval_id)

    def _input_required(
        self,
        approval: Approval,
        tool: Tool,
        arguments: dict[str, Any],
        request: HttpRequest,
        resumed: _Resumed,
    ) -> dict[str, Any]:
        """The InputRequiredResult of a call still waiting for the person: the first time, a URL-mode
        elicitation opening JupyterLab at the request (when the client can open URLs); then the state
        alone, which the client echoes to go on waiting."""
        state = ApprovalState(
            approval.id, request.user, tool.name, arguments_digest(arguments), approval.expires
        )
        result: dict[str, Any] = {"requestState": self._states.seal(state)}
        if resumed.state is None and resumed.opens_urls and request.lab_url:
            message = (
                f"Approval {approval.id} waits for you in JupyterLab: {approval.summary}. "
                "Approve or deny it there; the call goes on once it is decided."
            )
            url = f"{request.lab_url}?agent-approval={approval.id}"
            params = {"mode": "url", "message": message, "url": url}
            result["inputRequests"] = {APPROVAL_INPUT: {"method": "elicitation/create", "params": params}}
        return self._modern_result(result, "input_required")

    def _go_on_when_approved(self, tool: Tool, gate: ToolGate, approval: Approval) -> ToolResult:
        """A call still waiting for the person goes on as a run awaiting approval: eval and notebook runs
        as their own runs, the other tools as a tool call's run (``mcp_tool``, whose result is the call's);
        the agent follows it with run_status (its outcome: ran, refused, or denied), or stops it with
        run_cancel (the request is withdrawn). The answer is the run's summary, in every tool's schema."""
        policy = self.services.approval_policy
        how = (
            f"Approval {approval.id} ({approval.summary}) waits for the person in JupyterLab's Agents panel. "
        )
        if gate.detachable:

            async def run(emit: Emit, cancel: asyncio.Event) -> Mapping[str, Any]:
                async def start() -> Mapping[str, Any]:
                    arguments = await gate.bind(approval)
                    return await service_call(self.services, tool.name, arguments, emit, cancel)

                return await once_approved(policy, approval, emit, cancel, start)

            started = self.services.run_registry.start(
                tool.name if tool.name == "eval" else "notebook_run", gate.path, run, approval_id=approval.id
            )
        else:

            async def call(emit: Emit, cancel: asyncio.Event) -> Mapping[str, Any]:
                async def start() -> Mapping[str, Any]:
                    try:
                        arguments = await gate.bind(approval)  # 409 when the notebook changed since
                    except AgentToolsError as e:
                        return self._call_result(ToolResult(e.message, is_error=True), LEGACY_VERSIONS[-1])
                    return await self._execute(tool, arguments, LEGACY_VERSIONS[-1], cancel, _ignore)

                return await once_approved(policy, approval, emit, cancel, start)

            started = self.services.run_registry.start(
                "mcp_tool", tool.name, call, state_of=tool_state, approval_id=approval.id
            )
        text = how + (
            f"Once approved it runs as run {started.id} (it is not done again by calling this tool again): "
            f"run_status with run_id '{started.id}' and wait (seconds) waits for it and gives its outcome; "
            "run_cancel withdraws the request."
        )
        return ToolResult(text, {**started.summary(), "approval_id": approval.id})

    async def _allowed(
        self, tool: Tool, arguments: dict[str, Any], request: HttpRequest, version: str
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The call's arguments once it is allowed, with the focused notebook and cell in place of
        ``focus: true`` (:func:`~.tools.resolve_focus`); else the tool error that refuses it."""
        refused = await self._refusal(tool, arguments, request, version)
        if refused is not None:
            return arguments, refused
        try:
            return resolve_focus(tool.name, arguments, self.services.focus, request.agent), None
        except AgentToolsError as e:
            return arguments, self._call_result(ToolResult(e.message, is_error=True), version)

    async def _refusal(
        self, tool: Tool, arguments: dict[str, Any], request: HttpRequest, version: str
    ) -> dict[str, Any] | None:
        """The tool error when the caller lacks a permission the tool's route asks (eval with ``notebook``:
        also what :func:`~..execution.dispatch.extra_permissions` says; ``focus: true``: also ``read`` on
        ``agent_focus``); None when allowed."""
        extra = _extra_permissions(tool, arguments)
        for action, resource in (*tool.permissions, *extra):
            try:
                allowed = await request.authorize(action, resource)
            except AgentToolsError as e:  # an agent token's refusal: its message names the missing scope
                refused = ToolResult(f"Permission denied: {e.message}", is_error=True)
                return self._call_result(refused, version)
            if not allowed:
                needs = f"The {tool.name} tool needs {action!r} on {resource!r}"
                if (action, resource) in extra:
                    why = "focus: true" if tool.name in FOCUS_TOOLS else f"{tool.name} with 'notebook'"
                    needs = f"{why} also needs {action!r} on {resource!r}"
                result = ToolResult(
                    f"Permission denied: User is not authorized to {action} on resource: {resource}. "
                    f"{needs}; nothing was done.",
                    is_error=True,
                )
                return self._call_result(result, version)
        return None

    async def _execute(
        self,
        tool: Tool,
        arguments: dict[str, Any],
        version: str,
        cancel: asyncio.Event,
        progress: Callable[[str], None],
        authorize: Callable[[str, str], Awaitable[bool]] | None = None,
    ) -> dict[str, Any]:
        try:
            result = await tool.run(ToolCall(self.services, arguments, cancel, progress, authorize))
        except AgentToolsError as e:
            retry = f" (retry after {e.retry_after} s)" if e.retry_after else ""
            result = ToolResult(f"{e.message}{retry}", is_error=True)
        except Exception as e:
            # broad: a tool's failure of any kind becomes a JSON-RPC error answer (its status when it has one)
            status = getattr(e, "status_code", None)  # tornado's HTTPError from the kernel manager or gateway
            if not (isinstance(status, int) and 400 <= status < 600):
                self.log.exception("MCP tool %s failed", tool.name)
                raise RpcError(INTERNAL_ERROR, "Internal error: the tool failed (see the server log)") from e
            result = ToolResult(getattr(e, "log_message", None) or f"HTTP {status}", is_error=True)
        return self._call_result(result, version)

    def _call_result(self, result: ToolResult, version: str) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "text", "text": result.text}]
        content += [{"type": "image", "data": image.data, "mimeType": image.mime} for image in result.images]
        out: dict[str, Any] = {"content": content, "isError": result.is_error}
        if result.structured is not None and at_least(version, "2025-06-18"):  # (a raised cell's too)
            out["structuredContent"] = result.structured
        return self._modern_result(out) if version in MODERN_VERSIONS else out

    async def _stream(
        self,
        rid: RequestId,
        run: Awaitable[Mapping[str, Any]],
        progress: _Progress,
        call: _Call,
        session: LegacySession | None,
        *,
        modern: bool,
    ) -> AsyncIterator[Outgoing]:
        """Progress as it comes, a heartbeat after each silent interval, then the response."""
        if session is not None:
            session.calls[rid] = call
        task = asyncio.ensure_future(run)
        try:
            source = TaskSource(task, lambda: bool(progress.parts), progress.ready)
            async with contextlib.aclosing(pump(source, self.heartbeat_interval)) as beats:
                async for due in beats:
                    yield Outgoing(progress.take() if due else progress.heartbeat())
            if call.by_client:
                return  # the client said it will not read the response
            try:
                yield Outgoing(result_message(rid, task.result()), final=True)
            except RpcError as e:
                e.id = rid
                status = MODERN_STATUS.get(e.code, 200) if modern else 200
                yield Outgoing(e.to_message(), final=True, status=status)
        finally:
            if not task.done():
                call.cancel.set()
                await asyncio.gather(task, return_exceptions=True)
            if session is not None and session.calls.get(rid) is call:
                del session.calls[rid]

    # -- tasks (2025-11-25): a tools/call that goes on as a detached run --------------------------------

    def _tools_call_as_task(
        self, rid: RequestId, tool: Tool, arguments: dict[str, Any], task: Any, request: HttpRequest
    ) -> Answer:
        if not isinstance(task, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: 'task' must be an object ({\"ttl\": ms})", id=rid)
        if tool.task_support is None:
            raise RpcError(
                METHOD_NOT_FOUND,
                f"Tool {tool.name!r} does not run as a task (its execution.taskSupport is forbidden); "
                "call it without 'task'",
                id=rid,
            )
        return Answer(200, stream=self._start_task(rid, tool, arguments, request))

    async def _start_task(
        self, rid: RequestId, tool: Tool, arguments: dict[str, Any], request: HttpRequest
    ) -> AsyncIterator[Outgoing]:
        """Check the permissions now (a refusal is the call's answer), then start the tool as a run and
        answer the task at once (CreateTaskResult)."""
        # this cell (focus: true): the one focused now, not when the task runs
        arguments, refused = await self._allowed(tool, arguments, request, TASK_VERSION)
        if refused is not None:
            yield Outgoing(result_message(rid, refused), final=True)
            return

        async def call(emit: Emit, cancel: asyncio.Event) -> dict[str, Any]:
            def progress(text: str) -> None:
                if text:
                    emit({"type": "chunk", "index": 0, "name": "stdout", "text": text})

            def gate_progress(text: str) -> None:
                if text.startswith("Waiting for approval"):  # the task's status: input_required
                    emit({"type": "approval", "state": "pending", "summary": text.strip()})
                else:  # (any other event of the run's means it runs)
                    progress(text)

            passed, answer = await self._gate(
                tool, arguments, request, TASK_VERSION, cancel, gate_progress, until_decided=True
            )
            if answer is not None:
                return answer
            return await self._execute(tool, passed, TASK_VERSION, cancel, progress, request.authorize)

        run = self.services.run_registry.start("mcp_tool", tool.name, call, state_of=tool_state)
        yield Outgoing(result_message(rid, {"task": self._task_json(run)}), final=True)

    def _task_json(self, run: Any) -> dict[str, Any]:
        task: dict[str, Any] = {"taskId": run.id, "status": TASK_STATUS[run.state]}
        if run.message:
            task["statusMessage"] = run.message
        summary = run.summary()
        task["createdAt"] = summary["created"]
        task["lastUpdatedAt"] = summary["ended"] or summary["started"] or summary["created"]
        task["ttl"] = int(self.services.run_registry.run_retention * 1000)
        task["pollInterval"] = TASK_POLL_MS
        return task

    def _task(self, msg: Message) -> Any:
        task_id = msg.params.get("taskId")
        if not isinstance(task_id, str):
            raise RpcError(INVALID_PARAMS, "Invalid params: 'taskId' must be a string", id=msg.id)
        try:
            run = self.services.run_registry.get(task_id, Viewer(current_user()))
        except AgentToolsError:
            run = None
        if run is None or run.kind != "mcp_tool":
            raise RpcError(
                INVALID_PARAMS,
                f"Invalid params: no task {short_repr(task_id)} (expired or unknown)",
                id=msg.id,
            )
        return run

    def _task_method(self, msg: Message, session: LegacySession) -> Answer:
        registry = self.services.run_registry
        if msg.method == "tasks/list":
            if msg.params.get("cursor") is not None:
                raise RpcError(
                    INVALID_PARAMS, "Invalid params: unknown cursor (the list has one page)", id=msg.id
                )
            runs = [run for run in registry.list(Viewer(current_user())) if run.kind == "mcp_tool"]
            return Answer(200, result_message(msg.id, {"tasks": [self._task_json(run) for run in runs]}))
        run = self._task(msg)
        if msg.method == "tasks/get":
            return Answer(200, result_message(msg.id, self._task_json(run)))
        if msg.method == "tasks/cancel":
            if run.finished:
                raise RpcError(
                    INVALID_PARAMS,
                    f"Invalid params: task {run.id} is already {TASK_STATUS[run.state]}; it cannot be "
                    "cancelled",
                    id=msg.id,
                )
            registry.cancel(run.id, Viewer(current_user()))
            return Answer(200, result_message(msg.id, self._task_json(run)))
        # tasks/result: wait for the end (cancelled with the request), then the tool call's own result
        assert msg.id is not None
        call = _Call()
        stream = self._stream(
            msg.id, self._task_result(run, call.cancel), _Progress(None), call, session, modern=False
        )
        return Answer(200, stream=stream, cancel=call.cancel)

    async def _task_result(self, run: Any, cancel: asyncio.Event) -> dict[str, Any]:
        waiter = asyncio.ensure_future(run.done.wait())
        stop = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({waiter, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            stop.cancel()
        if run.result is None:
            raise RpcError(
                INTERNAL_ERROR, f"Task {run.id} {TASK_STATUS[run.state]}: {run.message or 'it has no result'}"
            )
        meta = {**run.result.get("_meta", {}), RELATED_TASK_KEY: {"taskId": run.id}}
        return {**run.result, "_meta": meta}

    # -- legacy sessions -----------------------------------------------------------------------------

    def _open_session(self, user: str, version: str) -> LegacySession:
        """A new session of ``user`` (the request's identity); at the per-identity cap its own least
        recently used session goes, so one client's flood ends only its own sessions (the global bound
        ends anyone's, but only once several identities are at their cap)."""
        self._expire()
        own = [sid for sid, session in self.sessions.items() if session.user == user]  # oldest first
        for sid in own[: max(0, len(own) - self.max_sessions_per_identity + 1)]:
            del self.sessions[sid]
        while len(self.sessions) >= MAX_SESSIONS:
            self.sessions.popitem(last=False)
        session = LegacySession(secrets.token_hex(16), user, version, time.monotonic())
        self.sessions[session.id] = session
        return session

    def _session(self, request: HttpRequest, rid: RequestId | None) -> LegacySession:
        sid = request.header(SESSION_HEADER)
        if sid is None:
            raise RpcError(
                INVALID_REQUEST,
                "Bad Request: no Mcp-Session-Id header; send initialize first (protocol versions up to "
                "2025-11-25), or send params._meta with the protocol version (2026-07-28)",
                id=rid,
            )
        self._expire()
        session = self.sessions.get(sid)
        if session is None or session.user != request.user:
            raise RpcError(
                INVALID_REQUEST,
                "Session not found: it was ended or the server restarted; send initialize again",
                status=404,
                id=rid,
            )
        session.last_used = time.monotonic()
        self.sessions.move_to_end(sid)
        return session

    def _expire(self) -> None:
        cutoff = time.monotonic() - SESSION_IDLE_SECONDS
        while self.sessions:
            oldest = next(iter(self.sessions.values()))
            if oldest.last_used >= cutoff or oldest.calls:
                break
            self.sessions.popitem(last=False)


APPROVAL_INPUT = "approval"  # the key of the elicitation opening JupyterLab at an approval request


@dataclass(frozen=True)
class _Resumed:
    """A 2026-07-28 call's retry fields, as the gate reads them (an echoed state and what the client
    answered to the elicitation, which is never an approval: the agent's own client could say anything)."""

    state: Any = None
    opens_urls: bool = False  # the client declared URL-mode elicitation
    declined: str | None = None  # 'decline' or 'cancel' when the client refused to open the page

    @classmethod
    def of(cls, params: dict[str, Any]) -> _Resumed:
        meta = params.get("_meta")
        capabilities = meta.get(CLIENT_CAPABILITIES_KEY) if isinstance(meta, dict) else None
        elicitation = capabilities.get("elicitation") if isinstance(capabilities, dict) else None
        opens_urls = isinstance(elicitation, dict) and isinstance(elicitation.get("url"), dict)
        responses = params.get("inputResponses")
        answer = responses.get(APPROVAL_INPUT) if isinstance(responses, dict) else None
        action = answer.get("action") if isinstance(answer, dict) else None
        declined = action if action in ("decline", "cancel") else None
        return cls(params.get("requestState"), opens_urls, declined)


def _extra_permissions(tool: Tool, arguments: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """What a call asks besides its tool's permissions: eval with ``notebook``; ``focus: true``."""
    extra = extra_permissions(arguments) if tool.name == "eval" else ()
    return (*extra, *focus_permissions(tool.name, arguments))


def _ignore(_text: str) -> None:
    return None
