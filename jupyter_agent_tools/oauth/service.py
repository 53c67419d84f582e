"""``AgentOAuth``: the server as the OAuth 2.1 authorization server of its own MCP endpoint.

An MCP client (Claude Code, VS Code, the MCP SDKs) that meets a 401 on ``/api/agent/mcp`` discovers this
server's metadata, registers (DCR), sends the person to the consent page (behind the server's own login),
and trades the code for an access token that IS an agent token (:mod:`jupyter_agent_tools.auth.store`):
the scopes, paths and ``ask`` the person chose, short-lived, audited as ``agent:oauth-<client>-<n>``. A
rotating refresh token renews it; reusing a spent one revokes the grant. Only on a server with agent tokens
(``AgentIdentityProvider`` and ``AgentAuthorizer``) and not behind JupyterHub (whose login is the hub's:
there :class:`jupyter_agent_tools.hub_oauth.service.HubOAuthService`, this class with signed tokens, signs
apps in for every user's server). The parts that differ are hooks: ``_activates``, ``audience``, ``_mint``,
``_access_revoked``, ``_revoke_token``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from traitlets import Bool, Dict, Float, Int, TraitError, Unicode, validate

from ..auth.identity import AgentTokens
from ..auth.store import TOKEN_ID_CHARS, iso, token_hash
from ..errors import AgentToolsError
from ..service import Service, at_least, in_range
from .cimd import fetch_document
from .core import (
    CODE_LIFETIME,
    MAX_CODES,
    MAX_PENDING,
    PENDING_LIFETIME,
    AuthorizationRequest,
    Client,
    CodeGrant,
    Consent,
    Expiring,
    OAuthError,
    check_challenge,
    check_registration,
    client_from_document,
    is_metadata_url,
    new_secret,
    redirect_matches,
    requested_scopes,
    same_resource,
    scope_string,
    secret_hash,
    token_name_part,
    verifier_matches,
    with_query,
)
from .grants import Grant, GrantStore, GrantStoreError

T = TypeVar("T")
REFRESH_PREFIX = "jrt_"


def behind_hub(provider: Any) -> bool:
    """Whether the server is a JupyterHub single-user server (the hub's login, not ours)."""
    if os.environ.get("JUPYTERHUB_API_TOKEN"):
        return True
    return any(c.__module__.startswith("jupyterhub") for c in type(provider).__mro__)


class AgentOAuth(Service):
    """OAuth sign-in for MCP clients: metadata, consent, codes, tokens, refresh, revocation, registration."""

    enabled = Bool(
        True,
        help="Whether MCP clients may sign in with OAuth (the server is then the authorization server of its "
        "MCP endpoint). Only with agent tokens turned on, and never behind JupyterHub. False: /api/agent/mcp "
        "answers 403 without credentials as before, and the OAuth routes 404.",
    ).tag(config=True)

    access_token_lifetime = Float(
        3600.0,
        help="Seconds an access token (an agent token) issued through OAuth lives; the client renews it with "
        "its refresh token. Between 60 and 86400 (AgentIdentityProvider.max_token_lifetime caps it too).",
    ).tag(config=True)

    max_grant_lifetime = Float(
        30 * 86400.0,
        help="Seconds at most a person may let an app stay connected (its refresh tokens' life): the consent "
        "page offers the choices up to it. Between 3600 and 366 days.",
    ).tag(config=True)

    max_clients = Int(
        100,
        help="Most registered OAuth clients (dynamic client registration) kept at once; a registration past "
        "it first forgets clients older than a day with no active grant, else answers 400.",
    ).tag(config=True)

    registrations_per_minute = Int(
        10,
        help="Most dynamic client registrations accepted per minute (all clients together); more answer 429.",
    ).tag(config=True)

    grants_db = Unicode(
        "",
        help="The SQLite file of OAuth clients and grants (private to the server's user). Empty: oauth.db in "
        "the jupyter_agent_tools directory of the server's data directory (jupyter --data-dir).",
    ).tag(config=True)

    fetch_client_metadata = Bool(
        True,
        help="Whether an app whose client_id is an https URL (a client ID metadata document, CIMD) is looked "
        "up there (https only, public addresses only, no redirects, 5 KB, client_metadata_timeout). False: "
        "only the documents pinned in client_metadata_documents are accepted (servers without egress).",
    ).tag(config=True)

    client_metadata_documents = Dict(
        {},
        help="Pinned client ID metadata documents, by their URL (the client_id): used as they are, never "
        "fetched. Each is what the app publishes: {client_id: <the URL>, client_name, redirect_uris, "
        "token_endpoint_auth_method: 'none'}.",
    ).tag(config=True)

    client_metadata_timeout = Float(
        5.0,
        help="Seconds fetching one client ID metadata document may take (lookup, connection, answer). "
        "Between 0.5 and 30.",
    ).tag(config=True)

    @validate("client_metadata_documents")
    def _valid_documents(self, proposal: Any) -> Any:
        for url, document in proposal["value"].items():
            if not is_metadata_url(url):
                raise TraitError(
                    f"AgentOAuth.client_metadata_documents: {url!r} is not an https URL with a path"
                )
            try:
                client_from_document(url, document, 0.0)
            except OAuthError as e:
                raise TraitError(f"AgentOAuth.client_metadata_documents: {e.description}") from None
        return proposal["value"]

    @validate("client_metadata_timeout")
    def _valid_metadata_timeout(self, proposal: Any) -> Any:
        value = proposal["value"]
        if not 0.5 <= value <= 30:
            raise TraitError(f"AgentOAuth.client_metadata_timeout must be between 0.5 and 30, got {value}")
        return value

    @validate("access_token_lifetime")
    def _valid_access_lifetime(self, proposal: Any) -> Any:
        return in_range(proposal, 60, 86400, "seconds")

    @validate("max_grant_lifetime")
    def _valid_grant_lifetime(self, proposal: Any) -> Any:
        return in_range(proposal, 3600, 366 * 86400, "seconds")

    @validate("max_clients")
    def _valid_max_clients(self, proposal: Any) -> Any:
        return in_range(proposal, 1, 100_000, "clients")

    @validate("registrations_per_minute")
    def _valid_rate(self, proposal: Any) -> Any:
        return at_least(proposal, 1)

    def __init__(
        self, *, provider: Any, data_dir: str, clock: Callable[[], float] = time.time, **kwargs: Any
    ):
        super().__init__(**kwargs)
        self.provider: AgentTokens | None = provider if isinstance(provider, AgentTokens) else None
        self.active = self._activates(provider)
        self.clock = clock
        self._data_dir = data_dir
        self._store: GrantStore | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-oauth")
        self._lock = asyncio.Lock()  # token endpoint changes, one at a time (rotation is read-then-write)
        self.pending = Expiring(PENDING_LIFETIME, MAX_PENDING, clock)
        self.codes = Expiring(CODE_LIFETIME, MAX_CODES, clock)
        self.redeemed = Expiring(CODE_LIFETIME * 10, MAX_CODES, clock)  # code -> grant id: a replay revokes
        self._registrations: deque[float] = deque()
        self._documents = Expiring(300.0, 100, clock)  # fetched client metadata documents, 5 minutes
        self._issued: dict[str, str] = {}  # id (AgentToken.id) of each access token issued here -> client
        if self.active:
            self._load()

    # -- plumbing ----------------------------------------------------------------------------------------

    def _activates(self, provider: Any) -> bool:
        """Whether sign-in is on: a server with agent tokens, not behind a hub (whose service signs in,
        :mod:`jupyter_agent_tools.hub_oauth`)."""
        return bool(self.enabled and self.provider is not None and not behind_hub(provider))

    @property
    def hub_issuer(self) -> str:
        """The hub's agent OAuth service MCP clients are sent to, on a single-user server configured for
        it (``c.HubAgentTokens.issuer``); empty otherwise."""
        if self.active or self.provider is None:
            return ""
        hub = self.provider.hub_tokens
        return hub.issuer if hub.enabled else ""

    def audience(self, resource: str, request_resource: str | None) -> str:
        """The MCP URL a code or refresh token is redeemed for: this server's (a hub service's: the one
        the person signed in for)."""
        return resource

    @property
    def store(self) -> GrantStore:
        if self._store is None:
            path = self.grants_db or os.path.join(self._data_dir, "jupyter_agent_tools", "oauth.db")
            try:
                self._store = GrantStore(path)
            except GrantStoreError as e:
                raise OAuthError("temporarily_unavailable", str(e), 503) from None
        return self._store

    def _load(self) -> None:
        """The access tokens issued before a restart (their apps' step-ups and MCP sessions). A grants file
        that cannot be opened is logged, and sign-in answers 503 naming it until it is fixed: the rest of
        the extension (and every static token) keeps working."""
        try:
            grants = self.store.grants()
        except (OAuthError, GrantStoreError) as e:
            self.log.error("OAuth sign-in is unavailable: %s", getattr(e, "description", e))
            return
        for grant in grants:
            if grant.access_hash and grant.active(self.clock()):
                self._issued[grant.access_hash[:TOKEN_ID_CHARS]] = grant.client_id

    async def _call(self, method: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.wrap_future(self._thread.submit(method, *args))
        except GrantStoreError as e:
            raise OAuthError("temporarily_unavailable", str(e), 503) from None

    def client_of(self, token_id: str) -> str | None:
        """The client an access token issued here was issued to (None: the agent token of this id was not
        issued through OAuth). Its client can sign in again for more scopes (a step-up), and its MCP
        sessions outlive its access tokens (they are the client's)."""
        return self._issued.get(token_id)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        if self._store is not None:
            self._store.close()

    # -- registration (RFC 7591) -------------------------------------------------------------------------

    async def register(self, metadata: Any) -> dict[str, Any]:
        name, uris = check_registration(metadata)
        now = self.clock()
        while self._registrations and self._registrations[0] < now - 60:
            self._registrations.popleft()
        if len(self._registrations) >= self.registrations_per_minute:
            raise OAuthError(
                "slow_down", "too many client registrations this minute: try again in a minute", 429
            )
        store = self.store
        if await self._call(store.count_clients) >= self.max_clients:
            await self._call(store.forget_idle_clients, now - 86400, now)
            if await self._call(store.count_clients) >= self.max_clients:
                raise OAuthError(
                    "invalid_client_metadata",
                    f"this server keeps at most {self.max_clients} registered apps (AgentOAuth.max_clients); "
                    "revoke connected apps you no longer use",
                )
        self._registrations.append(now)
        client = Client("jac_" + secrets.token_urlsafe(24), name, uris, now)
        await self._call(store.add_client, client)
        self.log.info("OAuth client %r registered (redirects %s)", name, ", ".join(uris))
        return client.public()

    # -- authorization -----------------------------------------------------------------------------------

    @property
    def accepts_documents(self) -> bool:
        """Whether client ID metadata documents are accepted (the metadata says so to clients)."""
        return bool(self.fetch_client_metadata or self.client_metadata_documents)

    async def client(self, client_id: str | None) -> Client:
        if not client_id:
            raise OAuthError("invalid_request", "client_id is missing")
        if is_metadata_url(client_id):
            return await self._document_client(client_id)
        found = await self._call(self.store.client, client_id)
        if found is None:
            raise OAuthError(
                "invalid_client",
                "this app is not registered on this server (it may have been forgotten): let it register "
                "again",
                401,
            )
        return found

    async def _document_client(self, url: str) -> Client:
        """The client an https client_id describes: a pinned document, else the document fetched there
        (kept 5 minutes)."""
        pinned = self.client_metadata_documents.get(url)
        if pinned is not None:
            return client_from_document(url, pinned, self.clock())
        if not self.fetch_client_metadata:
            raise OAuthError(
                "invalid_client",
                f"this server reads no client metadata documents from the internet, and {url} is not pinned "
                "(AgentOAuth.client_metadata_documents)",
                401,
            )
        known: Client | None = self._documents.get(url)
        if known is None:
            document = await fetch_document(url, self.client_metadata_timeout)
            known = client_from_document(url, document, self.clock())
            self._documents.put(url, known)
        return known

    async def authorization_request(self, params: dict[str, str], resource: str) -> AuthorizationRequest:
        """The checked request of an authorization endpoint's query. Errors about the client or redirect
        URI are shown to the person (``redirect`` False); the others go back to the client."""
        client = await self.client(params.get("client_id"))
        redirect_uri = params.get("redirect_uri") or ""
        if not redirect_uri and len(client.redirect_uris) == 1:
            redirect_uri = client.redirect_uris[0]
        if not redirect_matches(client.redirect_uris, redirect_uri):
            raise OAuthError("invalid_request", f"redirect_uri {redirect_uri!r} is not one of this app's")
        if params.get("response_type") != "code":
            raise OAuthError("unsupported_response_type", "response_type must be code", redirect=True)
        challenge = check_challenge(params.get("code_challenge"), params.get("code_challenge_method"))
        if not same_resource(params.get("resource"), resource):
            raise OAuthError("invalid_target", f"this server signs in for {resource} only", redirect=True)
        request = AuthorizationRequest(
            client=client,
            redirect_uri=redirect_uri,
            state=params.get("state"),
            challenge=challenge,
            scopes=requested_scopes(params.get("scope")),
            resource=params.get("resource"),
            created=self.clock(),
        )
        self.pending.put(request.id, request)
        return request

    def error_redirect(self, request: AuthorizationRequest, error: OAuthError, issuer: str) -> str:
        params = {"error": error.error, "error_description": error.description, "iss": issuer}
        if request.state is not None:
            params["state"] = request.state
        return with_query(request.redirect_uri, params)

    def decide(self, request_id: str, consent: Consent | None, user: str, issuer: str) -> str:
        """Where the person's answer sends the browser: the client's redirect URI with a code (or
        ``access_denied``), ``state`` and ``iss``. 400 when the consent page is no longer valid."""
        request: AuthorizationRequest | None = self.pending.pop(request_id)
        if request is None:
            raise AgentToolsError(
                "This sign-in request expired or was already answered: start the sign-in again from the app.",
                400,
            )
        if consent is None:
            self.log.info("OAuth sign-in of %r denied by %s", request.client.name, user)
            return self.error_redirect(request, OAuthError("access_denied", "the person said no"), issuer)
        code = new_secret()
        self.codes.put(code, CodeGrant(request, consent, user, self.clock()))
        params = {"code": code, "iss": issuer}
        if request.state is not None:
            params["state"] = request.state
        return with_query(request.redirect_uri, params)

    def grant_lifetime(self, asked: float) -> float:
        cap = self.max_grant_lifetime
        provider_cap = getattr(self.provider, "max_token_lifetime", 0) or 0
        if provider_cap:
            cap = min(cap, provider_cap)
        return max(60.0, min(asked, cap))

    # -- token endpoint ----------------------------------------------------------------------------------

    async def token(self, form: dict[str, str], resource: str) -> dict[str, Any]:
        grant_type = form.get("grant_type")
        if grant_type == "authorization_code":
            return await self._code(form, resource)
        if grant_type == "refresh_token":
            return await self._refresh(form, resource)
        raise OAuthError("unsupported_grant_type", "grant_type must be authorization_code or refresh_token")

    async def _code(self, form: dict[str, str], resource: str) -> dict[str, Any]:
        code = form.get("code") or ""
        if not code:
            raise OAuthError("invalid_request", "code is missing")
        async with self._lock:
            granted: CodeGrant | None = self.codes.pop(code)
            if granted is None:
                replayed = self.redeemed.get(code)
                if replayed is not None:  # RFC 6749 section 4.1.2: a code used twice revokes what it gave
                    await self._revoke_grant(int(replayed), "its authorization code was used twice")
                    raise OAuthError("invalid_grant", "this authorization code was already used")
                raise OAuthError("invalid_grant", "this authorization code is unknown or expired (60 s)")
            request = granted.request
            if form.get("client_id") != request.client.client_id:
                raise OAuthError("invalid_grant", "this authorization code was issued to another client")
            if form.get("redirect_uri", request.redirect_uri) != request.redirect_uri:
                raise OAuthError("invalid_grant", "redirect_uri differs from the authorization request's")
            if not verifier_matches(form.get("code_verifier"), request.challenge):
                raise OAuthError("invalid_grant", "code_verifier does not match the code_challenge (PKCE)")
            resource = self.audience(resource, request.resource)
            if not same_resource(form.get("resource"), resource):
                raise OAuthError("invalid_target", f"this server issues tokens for {resource} only")
            now = self.clock()
            lifetime = self.grant_lifetime(granted.consent.lifetime)
            grant = await self._call(
                self.store.add_grant,
                request.client,
                granted.user,
                granted.consent,
                now,
                now + lifetime,
                token_name_part(request.client.name),
                resource,
            )
            self.redeemed.put(code, grant.id)
            if request.client.verified_host is None:  # a registered client is one installation: the new
                # sign-in (a step-up for more scopes, or again after losing its tokens) replaces the old
                for older in await self._call(self.store.grants):
                    if older.client_id == grant.client_id and older.id != grant.id and older.active(now):
                        await self._revoke_grant(older.id, f"replaced by a new sign-in (grant {grant.id})")
            self.log.info(
                "OAuth grant %d: %r connected as agent:%s by %s (scopes %s)",
                grant.id,
                request.client.name,
                grant.token_name,
                granted.user,
                scope_string(grant.consent.scopes),
            )
            return await self._issue(grant)

    async def _mint(self, grant: Grant, lifetime: float) -> tuple[str, str]:
        """A new access token for ``grant`` living ``lifetime`` seconds, and its SHA-256: an agent token
        named after the grant (the previous one is revoked)."""
        assert self.provider is not None
        tokens = self.provider.tokens
        if grant.access_hash is not None:
            await self._revoke_token(grant.token_name)
        consent = grant.consent
        try:
            access, record = await tokens.call(
                tokens.create, grant.token_name, consent.scopes, consent.paths, lifetime, consent.ask
            )
        except AgentToolsError as e:
            raise OAuthError(
                "server_error", f"the access token could not be made: {e.message}", 500
            ) from None
        return access, record.token_hash

    async def _issue(self, grant: Grant) -> dict[str, Any]:
        """A new access token (:meth:`_mint`) and a new refresh token for ``grant``."""
        now = self.clock()
        lifetime = min(self.access_token_lifetime, grant.expires - now)
        cap = getattr(self.provider, "max_token_lifetime", 0) or 0
        if cap:
            lifetime = min(lifetime, cap)
        if lifetime < 60:
            await self._revoke_grant(grant.id, "it expired")
            raise OAuthError("invalid_grant", "this app's connection expired: sign in again")
        access, digest = await self._mint(grant, lifetime)
        consent = grant.consent
        refresh = new_secret(REFRESH_PREFIX)
        await self._call(self.store.add_refresh, grant.id, secret_hash(refresh))
        await self._call(self.store.set_access, grant.id, digest, now)
        self._issued[digest[:TOKEN_ID_CHARS]] = grant.client_id
        return {
            "access_token": access,
            "token_type": "Bearer",
            "expires_in": int(lifetime),
            "refresh_token": refresh,
            "scope": scope_string(consent.scopes),
        }

    async def _refresh(self, form: dict[str, str], resource: str) -> dict[str, Any]:
        refresh = form.get("refresh_token") or ""
        if not refresh:
            raise OAuthError("invalid_request", "refresh_token is missing")
        digest = secret_hash(refresh)
        async with self._lock:
            found = await self._call(self.store.refresh, digest)
            if found is None:
                raise OAuthError("invalid_grant", "this refresh token is unknown")
            gid, spent = found
            grant = await self._call(self.store.grant, gid)
            if grant is None:
                raise OAuthError("invalid_grant", "this refresh token is unknown")
            if form.get("client_id") and form.get("client_id") != grant.client_id:
                raise OAuthError("invalid_grant", "this refresh token was issued to another client")
            resource = self.audience(resource, grant.resource)
            if not same_resource(form.get("resource"), resource):
                raise OAuthError("invalid_target", f"this server issues tokens for {resource} only")
            if spent is not None:
                if grant.revoked is None:
                    self.log.warning(
                        "OAuth grant %d (%r): a refresh token was used twice; the grant is revoked",
                        grant.id,
                        grant.client_name,
                    )
                await self._revoke_grant(grant.id, "a refresh token was used twice (stolen?)")
                raise OAuthError(
                    "invalid_grant", "this refresh token was already used: the app must sign in again"
                )
            now = self.clock()
            if grant.revoked is not None or not grant.active(now):
                raise OAuthError(
                    "invalid_grant", "this app's connection was revoked or expired: sign in again"
                )
            if self._access_revoked(grant):
                await self._revoke_grant(grant.id, "its agent token was revoked")
                raise OAuthError("invalid_grant", "this app's agent token was revoked: sign in again")
            await self._call(self.store.spend_refresh, digest, now)
            return await self._issue(grant)

    def _access_revoked(self, grant: Grant) -> bool:
        """Whether the grant's current access token was revoked by the person (the tokens panel or CLI):
        that ends the grant too (this service revokes only the tokens it replaces)."""
        assert self.provider is not None
        if grant.access_hash is None:
            return False
        for record in self.provider.tokens.tokens():
            if record.token_hash == grant.access_hash:
                return record.revoked is not None
        return True  # gone from the token file: nothing to renew

    # -- revocation --------------------------------------------------------------------------------------

    async def _revoke_token(self, name: str) -> None:
        assert self.provider is not None
        try:
            await self.provider.revoke(name)
        except AgentToolsError as e:
            if e.status != 404:  # already revoked (or never made): nothing to do
                raise OAuthError("temporarily_unavailable", e.message, 503) from None

    async def _revoke_grant(self, gid: int, why: str) -> None:
        grant = await self._call(self.store.grant, gid)
        if grant is None:
            return
        await self._call(self.store.revoke_grant, gid, self.clock(), why)
        if grant.access_hash is not None:
            self._issued.pop(grant.access_hash[:TOKEN_ID_CHARS], None)
            await self._revoke_token(grant.token_name)
        self.log.info("OAuth grant %d (%r) revoked: %s", gid, grant.client_name, why)

    async def revoke(self, form: dict[str, str]) -> None:
        """RFC 7009: revoke the grant a refresh or access token belongs to (unknown tokens: nothing)."""
        token = form.get("token") or ""
        if not token:
            raise OAuthError("invalid_request", "token is missing")
        async with self._lock:
            grant: Grant | None = None
            found = await self._call(self.store.refresh, secret_hash(token))
            if found is not None:
                grant = await self._call(self.store.grant, found[0])
            else:
                grant = await self._call(self.store.grant_of_access, token_hash(token))
            if grant is None or grant.revoked is not None:
                return
            if form.get("client_id") and form.get("client_id") != grant.client_id:
                return  # not this client's token: nothing is said about it
            await self._revoke_grant(grant.id, "revoked by the app")

    async def grants(self) -> list[dict[str, Any]]:
        """Every grant, newest first (what the person sees as connected apps)."""
        now = self.clock()
        assert self.provider is not None
        used = {r.name: r.last_used for r in self.provider.tokens.tokens() if r.last_used is not None}
        out = []
        for grant in reversed(await self._call(self.store.grants)):
            item = grant.public(now)
            item["last_used"] = iso(used.get(grant.token_name))
            out.append(item)
        return out

    async def revoke_grant(self, gid: int) -> dict[str, Any]:
        """The person revokes a connected app (its access token too, which ends what it started); the
        grant as it is then."""
        async with self._lock:
            grant = await self._call(self.store.grant, gid)
            if grant is None:
                raise AgentToolsError(
                    f"no connected app with id {gid} (GET /api/agent/oauth/grants lists them)", 404
                )
            await self._revoke_grant(gid, "revoked by the person")
            after = await self._call(self.store.grant, gid)
        assert after is not None
        return after.public(self.clock())
