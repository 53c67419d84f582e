"""``AgentIdentityProvider``: jupyter_server's own identity provider, plus agent tokens.

Everything jupyter_server's default provider (``PasswordIdentityProvider``) accepts still works exactly
as before: the server's token, its password, the login cookie. A request whose token is an agent token
(``jat_...``, see :mod:`.store`) is the user ``agent:NAME`` instead, carrying its scopes and path globs
for :class:`~.authorizer.AgentAuthorizer`. An agent never gets a login cookie, and a cookie can never
name an agent, so an agent is who its token says on every request and nothing else.

Refused with 403 and a message that says why: an expired or revoked agent token; an agent token on a
server whose authorizer is not ``AgentAuthorizer`` (it would not apply the scopes); an agent token on a
route that never asks the authorizer (the agent's scopes could not be applied there).

A token that ends (revoked here, expired, or revoked by another server sharing the token file) ends what
it started: the provider fires one signal, :meth:`AgentIdentityProvider.on_token_ended`, to which its own
websocket table (:mod:`.connections`) and the extension's services (the approval gate withdraws the
token's requests and drops its grants, the run registry cancels its runs) subscribe.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider, User
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import PeriodicCallback
from traitlets import Float, Unicode

from ..audit import metrics
from ..audit.context import AGENT_PREFIX
from ..compat import allows_unauthenticated, cached_user, mark_token_authenticated
from ..errors import AgentToolsError
from ..stores import AgentStores, tagged
from ..wire import REFUSED_NOT_FOR_AGENTS, TOKEN_MAX_EXPIRES_IN
from .connections import AgentConnections
from .hub_tokens import HubAgentTokens, HubTokensUnavailable, TokenInvalid
from .paths import PathScope
from .store import TOKEN_PREFIX, AgentToken, TokenStore, iso

log = logging.getLogger(__name__)
HOW_TO_RENEW = "ask the server's owner for a new one (jupyter agent token create NAME --scopes ...)"

# Handlers that ask the authorizer themselves inside the method (websockets) or answer only what the
# user may see (the identity route): agents may use them although their methods are not @authorized.
SELF_AUTHORIZING = frozenset(
    {
        "jupyter_server.services.kernels.websocket.KernelWebsocketHandler",
        "jupyter_server.services.events.handlers.SubscribeWebsocket",
        "jupyter_server.services.api.handlers.IdentityHandler",
        "jupyter_server_terminals.handlers.TermSocket",
        "jupyter_lsp.handlers.LanguageServerWebSocketHandler",
        "jupyter_agent_tools.handlers.base.AgentAPIHandler",
    }
)
# Public routes that are not an agent's: the metrics name every agent, with its requests and refusals.
AGENT_REFUSED_ROUTES = {
    "jupyter_server.base.handlers.PrometheusMetricsHandler": "the server's metrics (they name every agent)",
}
# jupyter-collaboration's room websocket: it makes the room (loading the file) before it asks the
# authorizer, so an agent is authorized for it as soon as it is authenticated.
ROOM_WEBSOCKET = "jupyter_server_ydoc.handlers.YDocWebSocketHandler"
# Where the settings of the web application hold the extension's approval policy: set when the extension
# loaded. Without it agent tokens are refused everywhere (the agent limits could not be applied).
APPROVALS_SETTING = "jupyter_agent_tools_approvals"
NOT_LOADED = (
    "The jupyter_agent_tools server extension did not load (its configuration has an error: see the "
    "server's log at start), so the limits on agents cannot be applied: agent tokens are refused until "
    "the server starts with the extension loaded."
)
UNKNOWN_TOKEN = (
    "This agent token is not one of this server's (agent tokens belong to the server that made them; on "
    "JupyterHub each of a user's servers has its own): make one here with jupyter agent token create, or "
    "in JupyterLab's Agents panel (Connect an agent)."
)
# The code object of every method ``@authorized`` wraps (the decorator's inner function).
_AUTHORIZED_CODE = authorized(lambda self: None).__code__


@dataclass
class AgentUser(User):
    """The user of a request made with an agent token: ``agent:NAME``, its scopes and paths."""

    agent: str = ""
    scopes: frozenset[str] = frozenset()
    path_scope: PathScope | None = None
    ask: frozenset[str] = frozenset()  # the actions it asks the person for first (the approval gate)
    token_id: str = ""  # the token's id (AgentToken.id): what its approvals, grants and runs are keyed by


@dataclass(frozen=True)
class TokenEnded:
    """An agent token that can no longer be used, told to :meth:`AgentIdentityProvider.on_token_ended`'s
    listeners: its ``token_id`` (``AgentToken.id``), hash, name and ``status`` (revoked, expired)."""

    token_id: str
    token_hash: str
    name: str
    status: str

    @property
    def reason(self) -> str:
        if self.status == "expired":
            return "the agent's token expired"
        return f"the agent's token was {self.status}"


TokenListener = Callable[[TokenEnded], object]


_USER_FIELDS = tuple(f.name for f in fields(User))


def _refusal(
    handler: web.RequestHandler, status: int, message: str, reason: str | None = None
) -> web.HTTPError:
    """The error refusing an agent's request, which then has no user: jupyter_server's HTML error page
    needs one set to render the message (it otherwise fails, and the agent gets an empty 403)."""
    handler.current_user = None
    return web.HTTPError(status, message, reason=reason)


def _class_names(handler: web.RequestHandler) -> frozenset[str]:
    cls: Any = type(handler)
    return _names_of(cls)


@functools.lru_cache(maxsize=512)
def _names_of(cls: Any) -> frozenset[str]:
    """The dotted names of a handler class and its bases (asked on every agent request)."""
    return frozenset(f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__)


def _asks_authorizer(method: Any) -> bool:
    """Whether a handler method is ``@authorized`` (under any other decorators)."""
    seen = 0
    while method is not None and seen < 8:
        if getattr(method, "__code__", None) is _AUTHORIZED_CODE:
            return True
        method = getattr(method, "__wrapped__", None)
        seen += 1
    return False


class AgentTokens(IdentityProvider):
    """Agent tokens (user ``agent:NAME``) in front of an identity provider: a request whose token is an
    agent token is that agent, decided here; every other request goes to the provider it is mixed into
    (``super()``) unchanged. :class:`AgentIdentityProvider` mixes it into jupyter_server's default provider;
    :func:`with_agent_tokens` into whatever provider a server runs (JupyterHub's on a single-user server).
    Its settings are read as ``c.AgentIdentityProvider.*`` in both."""

    token_db = Unicode(
        "",
        help="The SQLite file of the agent tokens. Empty: agent_tokens.db in a jupyter_agent_tools "
        "directory of AgentStores.state_dir (by default the server's data directory, jupyter --data-dir). "
        "Tokens live per server: on JupyterHub, named servers of one user each have their own file.",
    ).tag(config=True)

    token_db_timeout = Float(
        2.0,
        min=0.0,
        max=60.0,
        help="Seconds a token change (create, revoke) waits while another process holds the token "
        "database's lock, before it answers 503 saying so. Checking a token never waits for it.",
    ).tag(config=True)

    max_token_lifetime = Float(
        0.0,
        min=0.0,
        max=float(TOKEN_MAX_EXPIRES_IN),
        help="Seconds an agent token may live at most (an organisation's cap, e.g. 86400 for a day). 0: no "
        "cap (up to 366 days, or until revoked). With a cap, a token asked for without an expiry expires "
        "after the cap, and one asked for longer is refused (400) saying so.",
    ).tag(config=True)

    connection_check_interval = Float(
        5.0,
        min=0.05,
        max=3600.0,
        help="Seconds between two checks that the agent tokens used on this server are still active: a "
        "token revoked by another server sharing the token database has its websockets closed, its "
        "approval requests withdrawn and its detached runs cancelled within this time. A revocation "
        "through this server, and an expiry, end them at once.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._tokens: TokenStore | None = None
        self._hub_tokens: HubAgentTokens | None = None
        self._connections = AgentConnections()
        self._listeners: list[TokenListener] = []
        self._watched: dict[str, AgentToken] = {}  # tokens used here, by hash, until they end
        self._expiries: dict[str, asyncio.TimerHandle] = {}  # a timer at each watched token's expiry
        self._sweep: PeriodicCallback | None = None
        self.on_token_ended(lambda ended: self._connections.end(ended.token_hash, ended.status))
        self._routes: dict[tuple[type, str], bool] = {}  # (handler class, method) -> agents may use it
        self._by_agent_token: weakref.WeakSet[web.RequestHandler] = weakref.WeakSet()

    @property
    def tokens(self) -> TokenStore:
        """The token store (opened on first use, when the configuration is complete)."""
        if self._tokens is None:
            stores = AgentStores(parent=self)
            path = self.token_db or stores.path(
                os.path.join("jupyter_agent_tools", "agent_tokens.db"), getattr(self.parent, "data_dir", None)
            )  # (per server: a hub's named server's file name carries its name, see _per_server)
            self._tokens = TokenStore(path, write_timeout=self.token_db_timeout, options=stores.options())
        return self._tokens

    @property
    def hub_tokens(self) -> HubAgentTokens:
        """The checker of access tokens the hub's OAuth service signs (``c.HubAgentTokens.*``; off until
        its issuer is set)."""
        if self._hub_tokens is None:
            self._hub_tokens = HubAgentTokens(parent=self, clock=lambda: self.tokens.now())
        return self._hub_tokens

    def lifetime(self, asked: float | None) -> float | None:
        """The seconds a new token lives (None: until revoked), for ``asked`` under the admin's cap."""
        cap = self.max_token_lifetime
        if not cap:
            return asked
        if asked is None:
            return cap
        if asked > cap:
            raise AgentToolsError(
                f"'expires_in' may be at most {cap:.0f} seconds on this server (its admin's cap, "
                f"c.AgentIdentityProvider.max_token_lifetime); got {asked:.0f}",
                400,
            )
        return asked

    @property
    def connections(self) -> AgentConnections:
        """The agent tokens' open websockets (muted and closed when their token ends)."""
        return self._connections

    # -- tokens that end -------------------------------------------------------------------------

    def on_token_ended(self, listener: TokenListener) -> None:
        """Call ``listener(ended)`` on the event loop for each agent token used on this server that ends
        (revoked, expired), once, as soon as this server knows."""
        self._listeners.append(listener)

    async def revoke(self, name: str) -> AgentToken:
        """Revoke the tokens named ``name`` (:meth:`TokenStore.revoke`), then end what they started."""
        store = self.tokens
        record = await store.call(store.revoke, name)
        self.check_tokens()
        return record

    def check_tokens(self) -> list[TokenEnded]:
        """Tell the listeners of every watched token that is no longer active; those tokens."""
        ended = []
        for digest, record in list(self._watched.items()):
            try:
                status = self.hub_tokens.status(record) if record.signed_by else self.tokens.status_of(digest)
            except AgentToolsError as e:  # the token file cannot be read now: the next check tries again
                log.warning("agent tokens not checked: %s", e)
                break
            if status == "active":
                continue
            del self._watched[digest]
            self.hub_tokens.forget(digest)
            timer = self._expiries.pop(digest, None)
            if timer is not None:
                timer.cancel()
            ended.append(TokenEnded(record.id, digest, record.name, status))
        for token in ended:
            log.info("agent token %r was %s: ending what it started", token.name, token.status)
            for listener in list(self._listeners):
                try:
                    listener(token)
                except Exception:
                    # broad: one listener failing in any way must not keep the others from ending theirs;
                    # logged
                    log.exception("ending what agent token %r started failed", token.name)
        return ended

    def _watch(self, record: AgentToken) -> None:
        """Watch a token used on this server until it ends: a check at its expiry, and a periodic one
        (another server may revoke it) while any token or late websocket is watched."""
        if record.token_hash in self._watched:
            return
        self._watched[record.token_hash] = record
        if record.expires is not None:
            delay = max(0.0, record.expires - self.tokens.now()) + 0.01
            loop = asyncio.get_running_loop()
            self._expiries[record.token_hash] = loop.call_later(delay, self.check_tokens)
        if self._sweep is None:
            self._sweep = PeriodicCallback(self._check, self.connection_check_interval * 1000)
            self._sweep.start()

    def _check(self) -> None:
        if any(r.signed_by for r in self._watched.values()):
            self.hub_tokens.read_soon(self.check_tokens)  # a grant revoked at the hub ends its tokens
        self.check_tokens()
        self._connections.close_late()
        if not self._watched and not self._connections.has_late and self._sweep is not None:
            self._sweep.stop()
            self._sweep = None

    def get_user(self, handler: web.RequestHandler) -> Any:
        """An agent token's user, else whatever jupyter_server's provider finds (token, cookie)."""
        current = cached_user(handler)
        if current:
            return current
        token = self.get_token(handler)
        if token and token.startswith(TOKEN_PREFIX):
            try:
                record = self.tokens.lookup(token)
            except AgentToolsError as e:  # the token database is locked, corrupt or unopenable: 503
                raise _refusal(handler, e.status, e.message) from None
            if record is None:  # never handed on: a hub would send it to its API on every request
                self._by_agent_token.add(handler)
                metrics.AGENT_REQUESTS.labels(agent="", outcome="unknown").inc()
                raise _refusal(handler, 403, UNKNOWN_TOKEN)
            return self._agent_user(handler, record)
        if token and self.hub_tokens.accepts(token):
            return self._signed_user(handler, token)
        return super().get_user(handler)

    async def _signed_user(self, handler: web.RequestHandler, token: str) -> AgentUser:
        """The agent of an access token the hub's OAuth service signed for this server: checked there
        (:class:`~.hub_tokens.HubAgentTokens`), then decided here like every agent token."""
        self._by_agent_token.add(handler)
        audience = f"{handler.request.protocol}://{handler.request.host}" + url_path_join(
            handler.settings.get("base_url", "/"), "api/agent/mcp"
        )
        try:
            record = await self.hub_tokens.check(token, audience)
        except TokenInvalid as e:
            handler._signed_token_refused = True  # type: ignore[attr-defined]  # MCP: 401 invalid_token
            metrics.AGENT_REQUESTS.labels(agent="", outcome="unknown").inc()
            raise _refusal(handler, 403, f"This access token is not accepted here: {e}.") from None
        except HubTokensUnavailable as e:
            raise _refusal(handler, 503, str(e)) from None
        return self._agent_user(handler, record)

    def _agent_user(self, handler: web.RequestHandler, record: AgentToken) -> AgentUser:
        self._by_agent_token.add(handler)  # first: even a refusal's page must not carry the server's token
        # a token, not a cookie: no XSRF check (JupyterHub's patch of jupyter_server's check reads this)
        mark_token_authenticated(handler)
        now = self.tokens.now()
        status = record.status(now)
        if status != "active":
            metrics.AGENT_REQUESTS.labels(agent=record.name, outcome=status).inc()
            when = iso(record.revoked if status == "revoked" else record.expires)
            verb = "expired" if status == "expired" else f"was {status}"
            message = f"The agent token {record.name!r} {verb} at {when}; {HOW_TO_RENEW}."
            if record.signed_by:
                handler._signed_token_refused = True  # type: ignore[attr-defined]
                message = f"The access token of {record.name!r} {verb} at {when}: sign in again."
            raise _refusal(handler, 403, message)
        policy = handler.settings.get(APPROVALS_SETTING)
        if policy is None:  # fail closed: nothing would apply the rules, the ask lists, the read denials
            metrics.AGENT_REQUESTS.labels(agent=record.name, outcome="refused").inc()
            raise _refusal(handler, 503, NOT_LOADED)
        if not getattr(handler.settings.get("authorizer"), "applies_agent_scopes", False):
            raise _refusal(
                handler,
                403,
                "Agent tokens are accepted only when the server's authorizer applies their scopes: set "
                'c.ServerApp.authorizer_class = "jupyter_agent_tools.auth.AgentAuthorizer" (docs/admin.md).',
            )
        refused = [what for name, what in AGENT_REFUSED_ROUTES.items() if name in _class_names(handler)]
        if refused:
            metrics.AGENT_REQUESTS.labels(agent=record.name, outcome="refused").inc()
            message = f"Agent tokens cannot read {refused[0]}: use the server's own token."
            raise _refusal(handler, 403, message, reason=REFUSED_NOT_FOR_AGENTS)
        if not self._route_asks_authorizer(handler):
            metrics.AGENT_REQUESTS.labels(agent=record.name, outcome="refused").inc()
            raise _refusal(
                handler,
                403,
                f"Agent tokens cannot use this route ({handler.request.method} {handler.request.path}): it "
                "does not check permissions, so the token's scopes could not apply.",
                reason=REFUSED_NOT_FOR_AGENTS,
            )
        if not record.signed_by:  # (a signed token is in no token file: its grant's use is the hub's)
            self.tokens.touch(record)
        self._watch(record)
        self._connections.add(record.token_hash, handler)
        metrics.AGENT_REQUESTS.labels(agent=record.name, outcome="authenticated").inc()
        name = AGENT_PREFIX + record.name
        user = AgentUser(
            username=name,
            name=name,
            display_name=f"Agent {record.name}",
            initials="AI",
            agent=record.name,
            scopes=record.effective_scopes,
            path_scope=policy.reach(name, record.path_scope, record.ask),
            ask=record.ask,
            token_id=record.id,
        )
        # AgentAuthorizer raises its own refusal (403 naming the scope, 404 outside the paths)
        if ROOM_WEBSOCKET in _class_names(handler):
            try:
                allowed = handler.settings["authorizer"].is_authorized(handler, user, "write", "contents")
            except web.HTTPError as e:
                raise _refusal(handler, e.status_code, e.log_message or "", e.reason) from None
            if not allowed:
                raise _refusal(handler, 403, f"Agent {record.name!r} may not join this collaboration room.")
        return user

    def _route_asks_authorizer(self, handler: web.RequestHandler) -> bool:
        """Whether the route serving this request asks the authorizer (so the agent's scopes apply), or
        is public anyway (``@allow_unauthenticated``)."""
        cls, method_name = type(handler), (handler.request.method or "GET").lower()
        key = (cls, method_name)
        known = self._routes.get(key)
        if known is None:
            method = getattr(cls, method_name, None)
            names = _class_names(handler)
            known = bool(
                names & SELF_AUTHORIZING or _asks_authorizer(method) or allows_unauthenticated(method)
            )
            self._routes[key] = known
        return known

    def is_token_authenticated(self, handler: web.RequestHandler) -> bool:
        """An agent token came in a header, not a cookie: like the server's token, no XSRF check."""
        return handler in self._by_agent_token or super().is_token_authenticated(handler)

    def hides_token_from(self, handler: web.RequestHandler) -> bool:
        """Whether the server's token must stay out of what ``handler`` renders: it serves an agent (whose
        pages would otherwise carry ``data-jupyter-api-token``, see ``compat.guard_page_token``)."""
        return handler in self._by_agent_token

    def lists_for(self, handler: web.RequestHandler, path: str) -> bool:
        """Whether a directory listing (``/api/contents``) served by ``handler`` may show ``path``: for an
        agent with path globs, only what they reach (a symlink only when where it leads is inside too)."""
        user = handler.current_user
        if not isinstance(user, AgentUser) or user.path_scope is None:
            return True
        root = getattr(getattr(handler, "contents_manager", None), "root_dir", None)
        return user.path_scope.allows(path, root)

    def user_from_cookie(self, cookie_value: str) -> User | None:
        """A login cookie's user; never an agent (agents get no cookie, so one naming an agent is forged
        or stale)."""
        user = super().user_from_cookie(cookie_value)
        if user is not None and user.username.startswith(AGENT_PREFIX):
            return None
        return user

    def update_user(self, handler: web.RequestHandler, user_data: Any) -> User:
        if isinstance(handler.current_user, AgentUser):
            raise ValueError("an agent's identity comes from its token and cannot be changed")
        return super().update_user(handler, user_data)

    def identity_model(self, user: User) -> dict[str, Any]:
        """The identity as jupyter_server shows it (``/api/me``): the User fields alone."""
        return {name: getattr(user, name) for name in _USER_FIELDS}


class AgentIdentityProvider(AgentTokens, PasswordIdentityProvider):
    """jupyter_server's ``PasswordIdentityProvider`` that also accepts agent tokens (user ``agent:NAME``).

    Enable with ``c.ServerApp.identity_provider_class = "jupyter_agent_tools.auth.AgentIdentityProvider"``
    together with ``c.ServerApp.authorizer_class = "jupyter_agent_tools.auth.AgentAuthorizer"``. A server
    whose provider is another class (JupyterHub's single-user server sets its own) gets agent tokens in
    front of it instead, when the extension loads (:func:`adopt_agent_tokens`).
    """


def _per_server(file_name: str) -> str:
    """``file_name`` for this server: a JupyterHub user's named servers share a home (so a data directory)
    but each has its own agent tokens: ``agent_tokens.NAME-HASH.db`` on a named server (the stores'
    naming, :func:`jupyter_agent_tools.stores.tagged`)."""
    return tagged(file_name)


@functools.lru_cache(maxsize=16)
def with_agent_tokens(provider_class: type[IdentityProvider]) -> type[AgentTokens]:
    """``provider_class`` with agent tokens in front of it (a subclass: the provider's own methods answer
    every request that does not carry an agent token). Named ``AgentIdentityProvider`` so that
    ``c.AgentIdentityProvider.*`` configures it as it configures the plain server's provider."""
    if issubclass(provider_class, AgentTokens):
        return provider_class
    made = type("AgentIdentityProvider", (AgentTokens, provider_class), {"__module__": __name__})
    made.__qualname__ = f"AgentIdentityProvider({provider_class.__qualname__})"
    return made


def adopt_agent_tokens(serverapp: Any) -> AgentTokens | None:
    """Put agent tokens in front of the server's identity provider, when its authorizer applies their
    scopes (``AgentAuthorizer``, the switch that turns agents on) and its provider does not take them
    (JupyterHub's single-user server replaces ``ServerApp.identity_provider_class`` with its own).

    The provider is wrapped, not replaced: a subclass of its class, made with its settings (JupyterHub's
    ``hub_auth`` and its caches included), stands where it stood for the web application and the
    authorizers. The provider that takes agent tokens; None if agents are not turned on."""
    provider: IdentityProvider | None = getattr(serverapp, "identity_provider", None)
    authorizer = getattr(serverapp, "authorizer", None)
    if isinstance(provider, AgentTokens):
        return provider
    if provider is None or not getattr(authorizer, "applies_agent_scopes", False):
        return None
    values = {k: v for k, v in provider.trait_values().items() if k not in ("parent", "config", "log")}
    wrapped = with_agent_tokens(type(provider))(parent=serverapp, log=provider.log, **values)
    wrapped.token_generated = provider.token_generated  # a generated token is printed in the server's URL
    serverapp.identity_provider = wrapped
    web_app = getattr(serverapp, "web_app", None)
    if web_app is not None:
        web_app.settings["identity_provider"] = wrapped
    seen: set[int] = set()
    while authorizer is not None and id(authorizer) not in seen:  # AgentAuthorizer and the one it wraps
        seen.add(id(authorizer))
        if authorizer.has_trait("identity_provider"):
            authorizer.identity_provider = wrapped
        authorizer = getattr(authorizer, "inner", None)
    log.info("agent tokens are taken in front of %s", type(provider).__qualname__)
    return wrapped
