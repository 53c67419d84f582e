"""OAuth 2.1 for MCP clients, the pure part: PKCE, redirect URIs, client metadata, codes, metadata documents.

No Tornado and no I/O here: the service (:mod:`.service`) keeps the grants and issues agent tokens, the
handlers (:mod:`jupyter_agent_tools.handlers.oauth`) parse requests and render answers.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from ..schemas import ASKABLE_ACTIONS, TOKEN_SCOPES

OAUTH_NAME_PREFIX = "oauth-"  # the agent token names of access tokens: oauth-<client>-<grant id>
CODE_LIFETIME = 60.0  # seconds an authorization code may be redeemed
PENDING_LIFETIME = 600.0  # seconds a person may take on the consent page
MAX_CODES = 1000  # outstanding codes (and remembered redeemed ones); the oldest are dropped past it
MAX_PENDING = 200  # consent pages open at once
MAX_REDIRECT_URIS = 10
MAX_CLIENT_NAME = 100
MAX_URI_LENGTH = 2000
CHALLENGE = re.compile(r"^[A-Za-z0-9_-]{43}$")  # base64url of a SHA-256, unpadded
VERIFIER = re.compile(r"^[A-Za-z0-9._~-]{43,128}$")  # RFC 7636 section 4.1
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
SCOPES = TOKEN_SCOPES
ASK_ACTIONS = ASKABLE_ACTIONS
# What a person may choose on the consent page for how long the app may stay connected.
LIFETIMES = {"1 hour": 3600.0, "1 day": 86400.0, "7 days": 7 * 86400.0, "30 days": 30 * 86400.0}


class OAuthError(Exception):
    """An OAuth error answer: ``error`` code (RFC 6749 section 5.2 and friends), a description, the status.

    ``redirect``: whether an authorization request's error goes back to the client's redirect URI (only
    once the client and the redirect URI are known good; otherwise the person is shown it)."""

    def __init__(self, error: str, description: str, status: int = 400, *, redirect: bool = False):
        super().__init__(description)
        self.error, self.description, self.status, self.redirect = error, description, status, redirect

    def body(self) -> dict[str, str]:
        return {"error": self.error, "error_description": self.description}


def secret_hash(secret: str) -> str:
    """The SHA-256 of a random secret (codes, refresh tokens): what is kept instead of the secret."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def new_secret(prefix: str = "") -> str:
    return prefix + secrets.token_urlsafe(32)


# -- PKCE (RFC 7636, S256 only) ----------------------------------------------------------------------


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def check_challenge(challenge: str | None, method: str | None) -> str:
    """The code challenge of an authorization request, or an error: PKCE with S256 is required."""
    if not challenge:
        raise OAuthError("invalid_request", "code_challenge is required (PKCE, S256)", redirect=True)
    if method != "S256":
        raise OAuthError(
            "invalid_request", "code_challenge_method must be S256 (plain is not accepted)", redirect=True
        )
    if not CHALLENGE.match(challenge):
        raise OAuthError("invalid_request", "code_challenge must be 43 base64url characters", redirect=True)
    return challenge


def verifier_matches(verifier: str | None, challenge: str) -> bool:
    if not verifier or not VERIFIER.match(verifier):
        return False
    return hmac.compare_digest(s256(verifier), challenge)


# -- redirect URIs (RFC 8252 for native apps) ----------------------------------------------------------


def _host(uri: str) -> str:
    return (urlsplit(uri).hostname or "").lower()


def is_loopback(uri: str) -> bool:
    parts = urlsplit(uri)
    return parts.scheme == "http" and (parts.hostname or "").lower() in LOOPBACK_HOSTS


def check_redirect_uri(uri: Any) -> str:
    """A redirect URI a client may register: ``http`` on a loopback address (any port, RFC 8252 section
    7.3) or ``https`` anywhere; no fragment, no user info."""
    if not isinstance(uri, str) or not uri or len(uri) > MAX_URI_LENGTH:
        raise OAuthError("invalid_redirect_uri", f"a redirect URI must be a URL string, got {_short(uri)}")
    try:
        parts = urlsplit(uri)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise OAuthError("invalid_redirect_uri", f"not a URL: {_short(uri)}") from None
    if parts.fragment or "@" in parts.netloc or not parts.hostname:
        raise OAuthError("invalid_redirect_uri", f"a redirect URI has a host and no fragment: {_short(uri)}")
    if parts.scheme == "https" or is_loopback(uri):
        return uri
    raise OAuthError(
        "invalid_redirect_uri",
        f"redirect URIs are http on a loopback address (127.0.0.1, [::1], localhost) or https: {_short(uri)}",
    )


def redirect_matches(registered: Iterable[str], given: str) -> bool:
    """Whether ``given`` is one of the client's redirect URIs: exactly, or a loopback one on another port
    (RFC 8252 section 7.3: native apps listen on whatever port is free)."""
    for uri in registered:
        if uri == given:
            return True
        if is_loopback(uri) and is_loopback(given):
            a, b = urlsplit(uri), urlsplit(given)
            if (a.hostname, a.path, a.query) == (b.hostname, b.path, b.query):
                return True
    return False


def with_query(uri: str, params: Mapping[str, str]) -> str:
    """``uri`` with ``params`` added to its query (the authorization response)."""
    parts = urlsplit(uri)
    query = "&".join(filter(None, [parts.query, urlencode(params)]))
    return urlunsplit(parts._replace(query=query))


def redirect_host(uri: str) -> str:
    """How the consent page names where the person's answer goes."""
    parts = urlsplit(uri)
    if is_loopback(uri):
        return f"an app on this computer ({parts.hostname}:{parts.port or 80})"
    return parts.netloc


# -- clients --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Client:
    """A client the server knows: registered (DCR) or described by its metadata document (CIMD)."""

    client_id: str
    name: str
    redirect_uris: tuple[str, ...]
    created: float
    verified_host: str | None = None  # the host of a client ID metadata document; None: unverified (DCR)

    def public(self) -> dict[str, Any]:
        """The registration answer (RFC 7591 section 3.2.1)."""
        return {
            "client_id": self.client_id,
            "client_id_issued_at": int(self.created),
            "client_name": self.name,
            "redirect_uris": list(self.redirect_uris),
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        }


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_registration(metadata: Any) -> tuple[str, tuple[str, ...]]:
    """The name and redirect URIs of a dynamic registration request (RFC 7591), public clients only."""
    if not isinstance(metadata, dict):
        raise OAuthError("invalid_client_metadata", "the registration request must be a JSON object")
    method = metadata.get("token_endpoint_auth_method", "none")
    if method != "none":
        raise OAuthError(
            "invalid_client_metadata",
            "only public clients may register here (token_endpoint_auth_method 'none'), got "
            + _short(method),
        )
    grants = metadata.get("grant_types", ["authorization_code"])
    if not isinstance(grants, list) or not set(grants) <= {"authorization_code", "refresh_token"}:
        raise OAuthError(
            "invalid_client_metadata", "grant_types may be authorization_code and refresh_token only"
        )
    types = metadata.get("response_types", ["code"])
    if not isinstance(types, list) or not set(types) <= {"code"}:
        raise OAuthError("invalid_client_metadata", "response_types may be code only")
    uris = metadata.get("redirect_uris")
    if not isinstance(uris, list) or not uris or len(uris) > MAX_REDIRECT_URIS:
        raise OAuthError(
            "invalid_redirect_uri", f"redirect_uris must list 1 to {MAX_REDIRECT_URIS} redirect URIs"
        )
    checked = tuple(check_redirect_uri(uri) for uri in uris)
    name = metadata.get("client_name")
    if name is None:
        name = ""
    if not isinstance(name, str):
        raise OAuthError("invalid_client_metadata", "client_name must be a string")
    name = " ".join(name.split())[:MAX_CLIENT_NAME]
    return name, checked


def token_name_part(client_name: str) -> str:
    """The client's name as part of an agent token name (``oauth-<this>-<n>``): lower-case letters,
    digits and dashes, at most 32 characters; ``app`` when nothing is left."""
    part = re.sub(r"[^a-z0-9]+", "-", client_name.lower()).strip("-")[:32].strip("-")
    return part or "app"


# -- scopes ---------------------------------------------------------------------------------------------


def requested_scopes(scope: str | None) -> frozenset[str]:
    """The scopes of a request's ``scope`` parameter this server knows (others are ignored: the person
    chooses on the consent page)."""
    return frozenset(s for s in (scope or "").split() if s in SCOPES)


def scope_string(scopes: Iterable[str]) -> str:
    chosen = set(scopes)
    return " ".join(s for s in SCOPES if s in chosen)


# -- codes and consent pages in memory -------------------------------------------------------------------


@dataclass(frozen=True)
class AuthorizationRequest:
    """A checked authorization request, waiting for the person's answer on the consent page."""

    client: Client
    redirect_uri: str
    state: str | None
    challenge: str
    scopes: frozenset[str]  # what the client asked for (preselected)
    resource: str | None
    created: float = 0.0
    id: str = field(default_factory=lambda: secrets.token_urlsafe(24))


@dataclass(frozen=True)
class Consent:
    """What the person chose: scopes, path globs, what to ask first, how long the app stays connected."""

    scopes: frozenset[str]
    paths: tuple[str, ...]
    ask: frozenset[str]
    lifetime: float


@dataclass(frozen=True)
class CodeGrant:
    """What an authorization code stands for (bound to its client, redirect URI and PKCE challenge)."""

    request: AuthorizationRequest
    consent: Consent
    user: str  # who consented
    issued: float


class Expiring:
    """A bounded map of secrets (kept by hash) to values that expire: the oldest is dropped past ``limit``."""

    def __init__(self, lifetime: float, limit: int, clock: Callable[[], float] = time.time):
        self.lifetime, self.limit, self.clock = lifetime, limit, clock
        self._items: OrderedDict[str, tuple[float, Any]] = OrderedDict()

    def _sweep(self) -> None:
        now = self.clock()
        while self._items:
            key, (expires, _) = next(iter(self._items.items()))
            if expires > now and len(self._items) <= self.limit:
                break
            del self._items[key]

    def put(self, key: str, value: Any) -> None:
        self._items[secret_hash(key)] = (self.clock() + self.lifetime, value)
        self._sweep()

    def get(self, key: str) -> Any:
        self._sweep()
        found = self._items.get(secret_hash(key))
        return None if found is None else found[1]

    def pop(self, key: str) -> Any:
        self._sweep()
        found = self._items.pop(secret_hash(key), None)
        return None if found is None else found[1]

    def __len__(self) -> int:
        self._sweep()
        return len(self._items)


# -- metadata documents -------------------------------------------------------------------------------


def authorization_server_metadata(issuer: str, endpoints: Mapping[str, str], cimd: bool) -> dict[str, Any]:
    """RFC 8414 metadata of this server as an authorization server."""
    return {
        "issuer": issuer,
        "authorization_endpoint": endpoints["authorize"],
        "token_endpoint": endpoints["token"],
        "registration_endpoint": endpoints["register"],
        "revocation_endpoint": endpoints["revoke"],
        "scopes_supported": list(SCOPES),
        "response_types_supported": ["code"],
        "response_modes_supported": ["query"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": ["none"],
        "revocation_endpoint_auth_methods_supported": ["none"],
        "code_challenge_methods_supported": ["S256"],
        "authorization_response_iss_parameter_supported": True,
        "client_id_metadata_document_supported": cimd,
    }


def protected_resource_metadata(resource: str, issuer: str) -> dict[str, Any]:
    """RFC 9728 metadata of the MCP endpoint."""
    return {
        "resource": resource,
        "authorization_servers": [issuer],
        "scopes_supported": list(SCOPES),
        "bearer_methods_supported": ["header"],
        "resource_name": "Jupyter (jupyter-agent-tools)",
    }


def challenge(
    resource_metadata: str, scopes: Iterable[str], error: str | None = None, description: str = ""
) -> str:
    """A ``WWW-Authenticate: Bearer`` challenge (RFC 6750 section 3, RFC 9728 section 5.1)."""
    parts = []
    if error:
        parts.append(f'error="{error}"')
    if description:
        parts.append('error_description="{}"'.format(description.replace("\\", "").replace('"', "'")))
    parts.append(f'resource_metadata="{resource_metadata}"')
    scope = scope_string(scopes)
    if scope:
        parts.append(f'scope="{scope}"')
    return "Bearer " + ", ".join(parts)


def same_resource(given: str | None, resource: str) -> bool:
    """Whether an RFC 8707 ``resource`` parameter names this server's MCP endpoint (or the server above it:
    a client may name the server's base URL)."""
    if not given:
        return True
    a, b = urlsplit(given), urlsplit(resource)
    if (a.scheme.lower(), (a.netloc or "").lower()) != (b.scheme.lower(), (b.netloc or "").lower()):
        return False
    mine = b.path.rstrip("/") + "/"
    return mine.startswith(a.path.rstrip("/") + "/") or a.path.rstrip("/") == b.path.rstrip("/")


def is_private_address(host: str) -> bool:
    """Whether ``host`` (an IP address literal) is loopback, private, link-local or otherwise not public."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return not address.is_global


def parse_consent(
    scopes: Iterable[str], ask: Iterable[str], paths_text: str, lifetime: str, max_lifetime: float
) -> Consent:
    """What the person chose on the consent page, checked (ValueError says what to fix)."""
    from ..auth.paths import MAX_GLOBS, GlobError, PathScope

    chosen = frozenset(scopes)
    if not chosen or not chosen <= set(SCOPES):
        raise ValueError(f"choose at least one of {', '.join(SCOPES)}")
    asked = frozenset(ask)
    if not asked <= set(ASK_ACTIONS):
        raise ValueError(f"'ask first' takes {', '.join(ASK_ACTIONS)}")
    globs = tuple(line.strip() for line in paths_text.splitlines() if line.strip())
    if len(globs) > MAX_GLOBS:
        raise ValueError(f"at most {MAX_GLOBS} paths")
    try:
        globs = PathScope(globs).globs if globs else ()
    except GlobError as e:
        raise ValueError(str(e)) from None
    seconds = LIFETIMES.get(lifetime)
    if seconds is None or seconds > max(max_lifetime, LIFETIMES["1 hour"]):
        raise ValueError("choose how long the app stays connected from the list")
    return Consent(scopes=chosen, paths=globs, ask=asked, lifetime=seconds)


# -- client ID metadata documents (CIMD) -------------------------------------------------------------------

MAX_DOCUMENT_BYTES = 5 * 1024


def is_metadata_url(client_id: str) -> bool:
    """Whether a client_id names a client ID metadata document: an https URL with a path, no fragment,
    no user info."""
    try:
        parts = urlsplit(client_id)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return False
    return (
        parts.scheme == "https"
        and bool(parts.hostname)
        and parts.path not in ("", "/")
        and not parts.fragment
        and "@" not in parts.netloc
        and len(client_id) <= MAX_URI_LENGTH
    )


def client_from_document(url: str, document: Any, now: float) -> Client:
    """The client a metadata document describes (its ``client_id`` must be the URL it was read from);
    public clients only, redirect URIs as for registration."""
    if not isinstance(document, dict):
        raise OAuthError("invalid_client", f"the client metadata document at {url} is not a JSON object", 401)
    if document.get("client_id") != url:
        raise OAuthError(
            "invalid_client", f"the client metadata document at {url} names another client_id", 401
        )
    try:
        name, uris = check_registration(document)
    except OAuthError as e:
        raise OAuthError(
            "invalid_client", f"the client metadata document at {url}: {e.description}", 401
        ) from None
    host = (urlsplit(url).hostname or "").lower()
    return Client(url, name or host, uris, now, verified_host=host)
