"""Access tokens the JupyterHub service (:mod:`jupyter_agent_tools.hub_oauth`) signs, on a single-user server.

An MCP client that signed in through the hub's service holds a signed token (:mod:`..oauth.jwt`) bound to
ONE server's MCP URL, carrying the scopes, paths and ``ask`` the person chose. This server checks it with
the service's public key only (its signature, ``iss``, ``aud`` == this server's MCP URL, ``sub`` == this
server's hub user, expiry) and whether its grant was revoked (the service's revocation list, read at most
every ``revocation_check_interval`` seconds), then hands it to the one decision point every agent token
goes through (:meth:`AgentTokens._agent_user`) as an :class:`~.store.AgentToken` of its own.
Configured as ``c.HubAgentTokens.*``; off until ``issuer`` is set.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Dict, Float, TraitError, Unicode, validate

from ..oauth.core import OAUTH_NAME_PREFIX, SCOPES, token_name_part
from ..oauth.jwt import (
    CRYPTOGRAPHY_MISSING,
    TokenInvalid,
    UnknownKey,
    check_claims,
    looks_like_jwt,
    public_keys,
    verify,
)
from ..schemas import ASKABLE_ACTIONS
from ..service import Service
from .paths import GlobError, PathScope
from .store import AgentToken

SERVICE_PREFIX = "/services/agent-oauth/"  # the service's routes on the hub (its name in docs/admin.md)
KEYS_EVERY = 30.0  # seconds at least between two fetches of the keys for an unknown key id
MAX_CLIENTS_KNOWN = 1000


class HubTokensUnavailable(Exception):
    """The service's keys or revocation list cannot be read (the message names the URL)."""


class HubAgentTokens(Service):
    """Checks access tokens the hub's OAuth service signed (for this server only)."""

    issuer = Unicode(
        "",
        help="The public origin of the JupyterHub whose agent OAuth service signs access tokens (its "
        "issuer), e.g. https://hub.example.org. Empty: such tokens are not accepted, and MCP clients are "
        "not told to sign in there.",
    ).tag(config=True)

    service_url = Unicode(
        "",
        help="Where this server reads the service's public keys (jwks) and revocation list (revoked): the "
        "service's base URL as this server reaches it, e.g. http://hub:10101/services/agent-oauth/ on "
        "Zero to JupyterHub. Empty: <issuer>/services/agent-oauth/.",
    ).tag(config=True)

    jwks = Dict(
        {},
        help='The service\'s public keys as a JWKS document ({"keys": [...]}), pinned: used instead of '
        "fetching them (servers that cannot reach the service). The revocation list is still read.",
    ).tag(config=True)

    revocation_check_interval = Float(
        30.0,
        help="Seconds between two reads of the service's list of revoked grants (a revoked app is refused, "
        "and its websockets closed, within this time). Between 1 and 3600.",
    ).tag(config=True)

    fetch_timeout = Float(5.0, help="Seconds one read of the keys or revocation list may take.").tag(
        config=True
    )

    @validate("fetch_timeout")
    def _valid_timeout(self, proposal: Any) -> Any:
        value = float(proposal["value"])
        if not 0.5 <= value <= 60:
            raise TraitError(f"HubAgentTokens.fetch_timeout must be between 0.5 and 60, got {value}")
        return value

    @validate("issuer")
    def _valid_issuer(self, proposal: Any) -> Any:
        value = str(proposal["value"]).rstrip("/")
        parts = urlsplit(value)
        if value and (parts.scheme not in ("http", "https") or not parts.netloc or parts.path):
            raise TraitError(
                f"HubAgentTokens.issuer must be an origin like https://hub.example.org: {value!r}"
            )
        return value

    @validate("jwks")
    def _valid_jwks(self, proposal: Any) -> Any:
        if proposal["value"]:
            try:
                if not public_keys(proposal["value"]):
                    raise ValueError("it holds no Ed25519 key")
            except (ValueError, TokenInvalid) as e:
                raise TraitError(f"HubAgentTokens.jwks: {e}") from None
        return proposal["value"]

    @validate("revocation_check_interval")
    def _valid_interval(self, proposal: Any) -> Any:
        value = float(proposal["value"])
        if not 1 <= value <= 3600:
            raise TraitError(
                f"HubAgentTokens.revocation_check_interval must be between 1 and 3600, got {value}"
            )
        return value

    def __init__(self, clock: Callable[[], float] = time.time, **kwargs: Any):
        super().__init__(**kwargs)
        self.clock = clock
        self._keys: dict[str, Any] = {}
        self._keys_read = -KEYS_EVERY
        self._revoked: frozenset[str] = frozenset()
        self._revoked_read: float | None = None
        self._reading: asyncio.Future[None] | None = None
        self._grants: dict[str, str] = {}  # token hash -> grant id, of the tokens seen (for check_tokens)
        self._clients: OrderedDict[str, str] = OrderedDict()  # token id -> the app it was issued to

    @property
    def enabled(self) -> bool:
        return bool(self.issuer)

    def accepts(self, token: str) -> bool:
        return self.enabled and looks_like_jwt(token)

    @property
    def base(self) -> str:
        url = self.service_url or self.issuer + SERVICE_PREFIX
        return url if url.endswith("/") else url + "/"

    async def _get(self, name: str) -> Any:
        url = self.base + name
        request = HTTPRequest(
            url,
            headers={"Accept": "application/json"},
            follow_redirects=False,
            connect_timeout=self.fetch_timeout,
            request_timeout=self.fetch_timeout,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
            return json.loads(response.body)
        except (HTTPClientError, OSError, ValueError) as e:  # HTTP error or timeout, connection, not JSON
            raise HubTokensUnavailable(
                f"the hub's agent OAuth service cannot be read at {url}: {e}"
            ) from None

    async def _read_keys(self) -> None:
        if self.jwks:
            self._keys = public_keys(self.jwks)
            return
        self._keys_read = self.clock()
        try:
            self._keys = public_keys(await self._get("jwks"))
        except ValueError as e:
            raise HubTokensUnavailable(f"the hub's agent OAuth service's keys are not a JWKS: {e}") from None

    async def _read_revoked(self) -> None:
        answer = await self._get("revoked")
        grants = answer.get("revoked") if isinstance(answer, dict) else None
        if not isinstance(grants, list):
            raise HubTokensUnavailable("the hub's agent OAuth service's revocation list is not a list")
        self._revoked = frozenset(str(g) for g in grants)
        self._revoked_read = self.clock()

    async def revoked(self) -> frozenset[str]:
        """The revoked grants, read again when older than the interval (a read already under way is
        shared). A list older than three intervals that cannot be read again refuses (fails closed)."""
        now = self.clock()
        if self._revoked_read is None or now - self._revoked_read >= self.revocation_check_interval:
            if self._reading is None or self._reading.done():
                self._reading = asyncio.ensure_future(self._read_revoked())
            try:
                await asyncio.shield(self._reading)
            except HubTokensUnavailable as e:
                stale = (
                    self._revoked_read is None
                    or now - self._revoked_read >= 3 * self.revocation_check_interval
                )
                if stale:
                    raise
                self.log.warning(
                    "%s (the list read %.0f s ago is used)", e, now - (self._revoked_read or now)
                )
        return self._revoked

    def read_soon(self, then: Callable[[], object]) -> None:
        """Read the revocation list in the background when it is due, then call ``then`` (the provider's
        periodic check: a grant revoked meanwhile ends what its tokens started)."""
        due = (
            self._revoked_read is None or self.clock() - self._revoked_read >= self.revocation_check_interval
        )
        if due and (self._reading is None or self._reading.done()):
            self._reading = asyncio.ensure_future(self._read_revoked())

            def done(read: asyncio.Future[None]) -> None:
                if read.cancelled():
                    return
                if read.exception() is not None:
                    self.log.warning("%s", read.exception())
                    return
                then()

            self._reading.add_done_callback(done)

    async def check(self, token: str, audience: str) -> AgentToken:
        """The agent token record of a signed access token for ``audience`` (this server's MCP URL);
        TokenInvalid says why it is refused, HubTokensUnavailable when the service cannot be read."""
        if not self._keys:
            await self._read_keys()
        try:
            claims = verify(token, self._keys)
        except UnknownKey:
            if self.jwks or self.clock() - self._keys_read < KEYS_EVERY:
                raise
            await self._read_keys()  # the service may have a new key
            claims = verify(token, self._keys)
        check_claims(claims, self.issuer, audience, self.clock())
        user = os.environ.get("JUPYTERHUB_USER")
        if user and claims["sub"] != user:
            raise TokenInvalid(f"the token was issued to {claims['sub']!r}, and this is {user!r}'s server")
        grant = claims["grant"]
        if grant in await self.revoked():
            raise TokenInvalid("the app's connection was revoked: sign in again")
        return self.record(token, claims)

    def record(self, token: str, claims: dict[str, Any]) -> AgentToken:
        """The agent token a checked token stands for: named ``oauth-<client>-<grant>`` (the audit's
        ``agent:oauth-...``), its scopes, paths and ``ask``; it ends at ``exp`` or when its grant is
        revoked."""
        scopes = frozenset(s for s in claims["scope"].split() if s in SCOPES)
        if not scopes:
            raise TokenInvalid("the token carries no scope this server knows")
        globs = tuple(claims.get("paths", []))
        try:
            path_scope = PathScope(globs) if globs else None
        except GlobError as e:
            raise TokenInvalid(f"the token's paths are not valid: {e}") from None
        digest = hashlib.sha256(token.encode()).hexdigest()
        grant = claims["grant"]
        name = f"{OAUTH_NAME_PREFIX}{token_name_part(str(claims.get('client_name') or 'app'))}-{grant}"
        record = AgentToken(
            name=name,
            token_hash=digest,
            scopes=scopes,
            paths=path_scope.globs if path_scope else (),
            created=float(claims["iat"]),
            expires=float(claims["exp"]),
            path_scope=path_scope,
            ask=frozenset(a for a in claims.get("ask", []) if a in ASKABLE_ACTIONS),
            signed_by=self.issuer,
        )
        self._grants[digest] = grant
        self._clients[record.id] = claims["client_id"]
        while len(self._clients) > MAX_CLIENTS_KNOWN:
            self._clients.popitem(last=False)
        return record

    def status(self, record: AgentToken) -> str:
        """A watched signed token's status now (expired, revoked as of the last revocation list)."""
        if self._grants.get(record.token_hash) in self._revoked:
            return "revoked"
        return record.status(self.clock())

    def forget(self, digest: str) -> None:
        self._grants.pop(digest, None)

    def client_of(self, token_id: str) -> str | None:
        """The app a signed token was issued to (its MCP sessions outlive each access token, and a
        step-up's new grant, as on a server's own sign-in)."""
        return self._clients.get(token_id)


__all__ = ["CRYPTOGRAPHY_MISSING", "HubAgentTokens", "HubTokensUnavailable", "TokenInvalid"]
