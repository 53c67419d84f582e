"""``HubOAuthService``: the OAuth 2.1 authorization server of every user's server on a JupyterHub.

Part A's service (:class:`~jupyter_agent_tools.oauth.service.AgentOAuth`: registration, CIMD, consent
requests, codes with PKCE, grants with rotating refresh tokens whose reuse revokes, revocation) with three
differences: the person signs in through the hub (the handlers, :mod:`.app`); a grant is for the ONE server
whose MCP URL the client named (RFC 8707 ``resource``: ``<hub>/user/<name>/[<server>/]api/agent/mcp``,
the person's own); its access tokens are signed with this service's Ed25519 key (:mod:`..oauth.jwt`),
which the single-user servers check with the public key alone (:mod:`..auth.hub_tokens`). The key, the
clients and the grants live in the service's state directory (``state_dir``), never in users' homes.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit

from traitlets import Unicode, default

from ..auth.store import token_hash
from ..oauth.core import AuthorizationRequest, OAuthError, scope_string
from ..oauth.grants import Grant, GrantStoreError, open_private
from ..oauth.jwt import LEEWAY, load_private_key, new_private_key_pem, public_jwk, sign
from ..oauth.service import AgentOAuth

MCP_PATH = "api/agent/mcp"


def server_of(resource: str, origin: str, hub_base: str) -> tuple[str, str]:
    """The (user, server name) whose MCP URL ``resource`` is on this hub (``origin`` and the hub's base
    URL), or OAuthError ``invalid_target`` saying what a resource must be."""
    expected = f"{origin}{hub_base}user/<name>/[<server>/]{MCP_PATH}"
    problem = OAuthError(
        "invalid_target",
        f"resource must be the MCP URL of one of your servers on this hub ({expected}), got {resource!r}",
        redirect=True,
    )
    try:
        parts = urlsplit(resource)
    except ValueError:
        raise problem from None
    if f"{parts.scheme}://{parts.netloc}".lower() != origin.lower() or parts.query or parts.fragment:
        raise problem
    prefix = hub_base + "user/"
    if not parts.path.startswith(prefix) or not parts.path.endswith("/" + MCP_PATH):
        raise problem
    middle = parts.path[len(prefix) : -len("/" + MCP_PATH)].split("/")
    if not 1 <= len(middle) <= 2 or not all(middle):
        raise problem
    return unquote(middle[0]), unquote(middle[1]) if len(middle) == 2 else ""


class HubOAuthService(AgentOAuth):
    """The hub's agent OAuth service: configured as ``c.HubOAuthService.*`` (and ``c.AgentOAuth.*``, the
    sign-in settings it shares with a server's own sign-in)."""

    state_dir = Unicode(
        "",
        help="The directory of the hub's agent OAuth service's state (created 0700): its signing key "
        "(signing_key.pem, 0600), its clients and grants (jupyter_agent_tools/oauth.db unless "
        "AgentOAuth.grants_db names another file). Empty: jupyter-agent-oauth in the "
        "directory the service starts in (the hub's, for a service the hub starts).",
    ).tag(config=True)

    public_url = Unicode(
        "",
        help="The hub's public origin (the issuer of the tokens, e.g. https://hub.example.org): what every "
        "single-user server's c.HubAgentTokens.issuer names. Empty: the origin of JUPYTERHUB_PUBLIC_URL "
        "(c.JupyterHub.public_url), else of each request.",
    ).tag(config=True)

    @default("public_url")
    def _default_public_url(self) -> str:
        given = os.environ.get("JUPYTERHUB_PUBLIC_URL", "")
        parts = urlsplit(given)
        return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""

    def __init__(self, clock: Callable[[], float] = time.time, **kwargs: Any):
        super().__init__(provider=None, data_dir="", clock=clock, **kwargs)
        self.state = os.path.abspath(self.state_dir or os.path.join(os.getcwd(), "jupyter-agent-oauth"))
        self._data_dir = self.state
        self.hub_base = "/" + os.environ.get("JUPYTERHUB_BASE_URL", "/").strip("/")
        self.hub_base = self.hub_base.rstrip("/") + "/"
        self.key = load_private_key(self._key_pem())
        self.jwk = public_jwk(self.key)

    def _activates(self, provider: Any) -> bool:
        return bool(self.enabled)

    def _load(self) -> None:
        return None  # (no agent token store: its access tokens are signed)

    def _key_pem(self) -> bytes:
        """The signing key: made on first start, then read (a private file of the service's user)."""
        os.makedirs(self.state, mode=0o700, exist_ok=True)
        try:
            path = open_private(os.path.join(self.state, "signing_key.pem"))
        except GrantStoreError as e:
            raise OSError(str(e)) from None
        with open(path, "rb") as f:
            pem = f.read()
        if not pem:
            pem = new_private_key_pem()
            with open(path, "wb") as f:
                f.write(pem)
            self.log.info("a new signing key for agent access tokens: %s", path)
        return pem

    def issuer(self, request_origin: str) -> str:
        return self.public_url or request_origin

    def jwks(self) -> dict[str, Any]:
        return {"keys": [self.jwk]}

    async def revoked(self) -> list[str]:
        """The grants revoked while their last access token may still live: what servers refuse."""
        since = self.clock() - self.access_token_lifetime - 2 * LEEWAY
        return [str(gid) for gid in await self._call(self.store.revoked_since, since)]

    # -- the person's server ------------------------------------------------------------------------------

    async def request_for(
        self, params: dict[str, str], person: str, origin: str
    ) -> tuple[AuthorizationRequest, str]:
        """The checked authorization request of ``person`` (signed in at the hub) and the server it is
        for: ``resource`` must name one of the person's servers."""
        resource = params.get("resource") or ""
        if not resource:
            await self.client(params.get("client_id"))  # an unknown app is shown to the person first
            raise OAuthError(
                "invalid_target",
                "name the server to connect in the resource parameter (its MCP URL, "
                f"{origin}{self.hub_base}user/{person}/{MCP_PATH})",
                redirect=True,
            )
        user, server = server_of(resource, origin, self.hub_base)
        if user != person:
            raise OAuthError(
                "access_denied", f"{resource} is not your server: you are signed in as {person!r}", 403
            )
        request = await self.authorization_request(params, resource)
        return request, f"{user}'s server{' ' + repr(server) if server else ''}"

    def audience(self, resource: str, request_resource: str | None) -> str:
        return request_resource or resource

    # -- access tokens --------------------------------------------------------------------------------------

    async def _mint(self, grant: Grant, lifetime: float) -> tuple[str, str]:
        """A signed access token for the grant's server, living ``lifetime`` seconds."""
        now = self.clock()
        consent = grant.consent
        claims = {
            "iss": self.public_url or _origin(grant.resource),
            "aud": grant.resource,
            "sub": grant.user,
            "client_id": grant.client_id,
            "client_name": grant.client_name,
            "scope": scope_string(consent.scopes),
            "paths": list(consent.paths),
            "ask": sorted(consent.ask),
            "grant": str(grant.id),
            "jti": uuid.uuid4().hex,
            "iat": int(now),
            "exp": int(now + lifetime),
        }
        token = sign(claims, self.key, self.jwk["kid"])
        return token, token_hash(token)

    def _access_revoked(self, grant: Grant) -> bool:
        return False  # a signed token is revoked with its grant only

    async def _revoke_token(self, name: str) -> None:
        return None  # servers refuse the tokens of a revoked grant (the revocation list)

    async def grants_of(self, user: str) -> list[dict[str, Any]]:
        """The person's connected apps, newest first (their grants on any of their servers)."""
        now = self.clock()
        out = []
        for grant in reversed(await self._call(self.store.grants)):
            if grant.user == user:
                out.append({**grant.public(now), "server": grant.resource})
        return out

    async def revoke_own(self, user: str, gid: int) -> None:
        """The person disconnects one of their apps (404 for another's, as for none)."""
        async with self._lock:
            grant = await self._call(self.store.grant, gid)
            if grant is None or grant.user != user:
                raise OAuthError("invalid_request", f"you have no connected app with id {gid}", 404)
            await self._revoke_grant(gid, "revoked by the person")


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
