"""OAuth sign-in for MCP clients: the thin handlers over :class:`~..oauth.service.AgentOAuth`.

Public (no credentials): the metadata documents (RFC 9728, RFC 8414, OpenID discovery), the token,
registration and revocation endpoints; they read no cookie, so they check no XSRF. The authorization
endpoint is the person's: behind the server's own login (a browser that is not logged in is sent to the
login page and back), refused to agents, its form XSRF-protected.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated, authorized
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ..auth.identity import AgentUser
from ..compat import status_reason
from ..errors import AgentToolsError
from ..oauth.core import (
    ASK_ACTIONS,
    LIFETIMES,
    SCOPES,
    AuthorizationRequest,
    Consent,
    OAuthError,
    authorization_server_metadata,
    parse_consent,
    protected_resource_metadata,
    redirect_host,
)
from ..oauth.service import AgentOAuth
from .base import AgentAPIHandler, acting_person

MCP_PATH = "api/agent/mcp"
OAUTH_PATH = "api/agent/oauth"
FORM = "application/x-www-form-urlencoded"
# The consent pages' policy (this server's and the hub service's): no script, no frame, inline style only.
CONSENT_CSP = "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'"


class Urls:
    """The URLs of this server as a request reached it (scheme and host as the client used them)."""

    def __init__(self, handler: JupyterHandler):
        self.origin = f"{handler.request.protocol}://{handler.request.host}"
        self.base = handler.base_url if handler.base_url.endswith("/") else handler.base_url + "/"

    @property
    def issuer(self) -> str:
        """Path-less on a server at the origin's root; the base URL's path under one."""
        return self.origin + self.base.rstrip("/")

    @property
    def resource(self) -> str:
        return self.origin + url_path_join(self.base, MCP_PATH)

    @property
    def resource_metadata(self) -> str:
        """Where the MCP endpoint's 401 points: under the base URL (what a proxy in front routes here)."""
        return self.origin + url_path_join(self.base, ".well-known/oauth-protected-resource", MCP_PATH)

    def endpoint(self, name: str) -> str:
        return self.origin + url_path_join(self.base, OAUTH_PATH, name)

    def endpoints(self) -> dict[str, str]:
        return {name: self.endpoint(name) for name in ("authorize", "token", "register", "revoke")}


class OAuthAnswers(web.RequestHandler):
    """A public OAuth endpoint's answers: JSON, errors as ``{"error", "error_description"}``, CORS, form
    parameters each once. Mixed into this server's handlers and the hub service's (:mod:`..hub_oauth`)."""

    def check_xsrf_cookie(self) -> None:
        return None  # public endpoints: no cookie is read, so no cross-site request can use one

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Cache-Control", "no-store")
        self.set_header("Access-Control-Allow-Origin", "*")  # browser-based MCP clients read them too
        self.set_header("Access-Control-Allow-Headers", "Content-Type, MCP-Protocol-Version, Authorization")
        self.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")

    @allow_unauthenticated
    def options(self, *args: Any) -> None:
        self.set_status(204)
        self.finish()

    def answer(self, body: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None))[1]
        if isinstance(error, OAuthError):
            self.set_status(error.status)
            if error.status == 401:
                self.set_header("WWW-Authenticate", 'Bearer error="invalid_client"')
            self.answer(error.body(), error.status)
            return
        message = error.log_message if isinstance(error, web.HTTPError) else None
        self.answer({"error": "server_error" if status_code >= 500 else "invalid_request",
                     "error_description": message or status_reason(self)}, status_code)  # fmt: skip

    def form(self) -> dict[str, str]:
        """The body's form parameters, each once (RFC 6749 section 3.2)."""
        if not self.request.headers.get("Content-Type", "").startswith(FORM):
            raise OAuthError("invalid_request", f"send the parameters as {FORM}")
        out = {}
        for name, values in self.request.body_arguments.items():
            if len(values) != 1:
                raise OAuthError("invalid_request", f"parameter {name!r} is sent more than once")
            out[name] = values[0].decode("utf-8", "replace")
        return out


class _OAuthHandler(OAuthAnswers, JupyterHandler):
    """A public OAuth endpoint of this server."""

    oauth: AgentOAuth

    def initialize(self, oauth: AgentOAuth) -> None:
        self.oauth = oauth

    def check_active(self) -> None:
        if not self.oauth.active:
            raise web.HTTPError(404, "OAuth sign-in is not enabled on this server")


class ResourceMetadataHandler(_OAuthHandler):
    """RFC 9728: the MCP endpoint's protected resource metadata."""

    @allow_unauthenticated
    def get(self) -> None:
        urls = Urls(self)
        hub = self.oauth.hub_issuer  # a hub's single-user server: the hub's service signs apps in
        if not hub:
            self.check_active()
        self.answer(protected_resource_metadata(urls.resource, hub or urls.issuer))


class ServerMetadataHandler(_OAuthHandler):
    """RFC 8414 (and OpenID discovery's location of it): the authorization server metadata."""

    @allow_unauthenticated
    def get(self) -> None:
        self.check_active()
        urls = Urls(self)
        self.answer(
            authorization_server_metadata(urls.issuer, urls.endpoints(), cimd=self.oauth.accepts_documents)
        )


class RegisterHandler(_OAuthHandler):
    """RFC 7591 dynamic client registration, public clients only."""

    @allow_unauthenticated
    async def post(self) -> None:
        self.check_active()
        try:
            metadata = json.loads(self.request.body or b"null")
        except ValueError:
            raise OAuthError("invalid_client_metadata", "the body must be JSON") from None
        self.answer(await self.oauth.register(metadata), 201)


class TokenHandler(_OAuthHandler):
    """The token endpoint: authorization_code (with PKCE) and refresh_token grants."""

    @allow_unauthenticated
    async def post(self) -> None:
        self.check_active()
        self.answer(await self.oauth.token(self.form(), Urls(self).resource))


class RevokeHandler(_OAuthHandler):
    """RFC 7009 token revocation: the grant of a refresh or access token ends (200 whatever the token)."""

    @allow_unauthenticated
    async def post(self) -> None:
        self.check_active()
        await self.oauth.revoke(self.form())
        self.answer({})


class AuthorizeHandler(JupyterHandler):
    """The consent page (GET) and the person's answer (POST), behind the server's login."""

    auth_resource = "agent_tokens"  # no agent scope grants it: agents are refused by AgentAuthorizer too
    oauth: AgentOAuth

    def initialize(self, oauth: AgentOAuth) -> None:
        self.oauth = oauth

    @property
    def content_security_policy(self) -> str:
        return CONSENT_CSP

    def _person(self) -> str:
        if isinstance(self.current_user, AgentUser):
            raise web.HTTPError(403, "Agents cannot sign apps in: only the person can, in a browser.")
        return acting_person(self)  # type: ignore[arg-type]

    @web.authenticated
    @authorized("write")
    async def get(self) -> None:
        if not self.oauth.active:
            raise web.HTTPError(404, "OAuth sign-in is not enabled on this server")
        self._person()
        urls = Urls(self)
        params = {k: self.get_query_argument(k) for k in self.request.query_arguments}
        try:
            request = await self.oauth.authorization_request(params, urls.resource)
        except OAuthError as e:
            if not e.redirect:
                self._page("Sign-in refused", f"<p>{html.escape(e.description)}</p>", status=e.status)
                return
            # the client and redirect URI are good: the error goes back to the app
            client = await self.oauth.client(params.get("client_id"))
            redirect = params.get("redirect_uri") or client.redirect_uris[0]
            fake = AuthorizationRequest(client, redirect, params.get("state"), "", frozenset(), None)
            self.redirect(self.oauth.error_redirect(fake, e, urls.issuer))
            return
        self._consent(request)

    @web.authenticated
    @authorized("write")
    async def post(self) -> None:
        if not self.oauth.active:
            raise web.HTTPError(404, "OAuth sign-in is not enabled on this server")
        person = self._person()
        urls = Urls(self)
        request_id = self.get_body_argument("request", "")
        consent = None
        if self.get_body_argument("decision", "") == "approve":
            try:
                consent = consent_of(self, self.oauth.max_grant_lifetime)
            except ValueError as e:
                pending = self.oauth.pending.get(request_id)
                if pending is None:
                    raise web.HTTPError(
                        400, "This sign-in request expired: start again from the app."
                    ) from None
                self._consent(pending, error=str(e), status=400)
                return
        try:
            target = self.oauth.decide(request_id, consent, person, urls.issuer)
        except AgentToolsError as e:
            self._page("Sign-in expired", f"<p>{html.escape(e.message)}</p>", status=e.status)
            return
        self.redirect(target)

    def _consent(self, request: AuthorizationRequest, error: str = "", status: int = 200) -> None:
        body = consent_form(request, self.oauth.max_grant_lifetime, self.xsrf_form_html(), error)
        self._page("Connect an agent", body, status=status)

    def _page(self, title: str, body: str, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(PAGE.format(title=html.escape(title), body=body))


class _GrantRoute(AgentAPIHandler):
    """The connected apps, for the person (the server's own credentials; agents are refused)."""

    auth_resource = "agent_tokens"

    @property
    def signins(self) -> AgentOAuth:
        if isinstance(self.current_user, AgentUser):
            raise AgentToolsError(
                "Agents cannot see or revoke connected apps: use the server's own token.", 403
            )
        if not self.app.oauth.active:
            raise AgentToolsError("OAuth sign-in is not enabled on this server", 404)
        return self.app.oauth


class GrantListHandler(_GrantRoute):
    """GET: every app signed in through OAuth (newest first), with its scopes, paths, status, last use."""

    route_name = "oauth_grants"

    @web.authenticated
    @authorized("read")
    async def get(self) -> None:
        try:
            await self.write_json({"grants": await self.signins.grants()})
        except OAuthError as e:
            raise AgentToolsError(e.description, e.status) from None


class GrantHandler(_GrantRoute):
    """DELETE: disconnect an app (its refresh token and access token end, and what the token started)."""

    route_name = "oauth_grant"

    @web.authenticated
    @authorized("write")
    async def delete(self, grant_id: str) -> None:
        signins = self.signins
        if not grant_id.isdigit() or len(grant_id) > 18:
            raise AgentToolsError(f"no connected app with id {grant_id!r}", 404)
        try:
            await self.write_json(await signins.revoke_grant(int(grant_id)))
        except OAuthError as e:
            raise AgentToolsError(e.description, e.status) from None


def consent_of(handler: web.RequestHandler, max_lifetime: float) -> Consent:
    """What the person chose on the consent form ``handler`` received (:func:`parse_consent`: a
    ``ValueError`` says what is wrong); the form of this server and of the hub's OAuth service alike."""
    return parse_consent(
        handler.get_body_arguments("scope"),
        handler.get_body_arguments("ask"),
        handler.get_body_argument("paths", ""),
        handler.get_body_argument("lifetime", ""),
        max_lifetime,
    )


def consent_form(
    request: AuthorizationRequest,
    max_lifetime: float,
    xsrf_html: str,
    error: str = "",
    target: str = "this Jupyter server",
) -> str:
    """The consent page's body: who asks (its metadata document's host, or unverified), where the answer
    goes, and the person's choices (scopes, paths, ask first, how long). Shared with the hub's service."""
    e = html.escape
    client = request.client
    name = e(client.name or "An app")
    if client.verified_host:
        who = f"<strong>{name}</strong> (from <strong>{e(client.verified_host)}</strong>)"
    else:
        who = f"<strong>{name}</strong> <span class='warn'>(unverified app: it named itself)</span>"
    wanted = request.scopes or frozenset({"read"})
    scope_boxes = "".join(
        f"<label><input type='checkbox' name='scope' value='{s}'{' checked' if s in wanted else ''}> "
        f"{s}: {e(SCOPE_TEXT[s])}</label>"
        for s in SCOPES
    )
    ask_boxes = "".join(
        f"<label><input type='checkbox' name='ask' value='{a}'> {a}</label>" for a in ASK_ACTIONS
    )
    cap = max_lifetime
    options = "".join(
        f"<option value='{e(label)}'{' selected' if label == '1 day' else ''}>{e(label)}</option>"
        for label, seconds in LIFETIMES.items()
        if seconds <= max(cap, 3600)
    )
    problem = f"<p class='error'>{e(error)}</p>" if error else ""
    body = f"""
<p>{who} asks to use {e(target)} as an agent.</p>
<p>Your answer goes to {e(redirect_host(request.redirect_uri))}.</p>
{problem}
<form method="post" action="">
{xsrf_html}
<input type="hidden" name="request" value="{e(request.id)}">
<fieldset><legend>It may</legend>{scope_boxes}</fieldset>
<fieldset><legend>Only these paths (one glob per line, e.g. <code>reports/**</code>; empty: all)</legend>
<textarea name="paths" rows="3" cols="40"></textarea></fieldset>
<fieldset><legend>Ask me first before</legend>{ask_boxes}</fieldset>
<fieldset><legend>Stay connected for</legend><select name="lifetime">{options}</select></fieldset>
<p><button type="submit" name="decision" value="approve" class="primary">Allow</button>
<button type="submit" name="decision" value="deny">Deny</button></p>
</form>"""
    return body


SCOPE_TEXT = {
    "read": "read notebooks and files",
    "edit": "change notebooks and files",
    "execute": "run code (kernels)",
}

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} - Jupyter</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; background: #f5f5f5;
  color: #212121; margin: 0; }}
header {{ background: #fff; border-bottom: 1px solid #e0e0e0; padding: 8px 16px; font-weight: 600; }}
header span {{ color: #f37726; }}
main {{ max-width: 560px; margin: 32px auto; background: #fff; border: 1px solid #e0e0e0;
  padding: 16px 24px; }}
fieldset {{ border: 1px solid #e0e0e0; margin: 12px 0; }}
label {{ display: block; margin: 4px 0; }}
.warn, .error {{ color: #d84315; }}
button {{ padding: 6px 16px; border: 1px solid #bdbdbd; background: #fff; cursor: pointer; }}
button.primary {{ background: #1976d2; color: #fff; border-color: #1976d2; }}
</style></head>
<body><header><span>Jupyter</span> &middot; {title}</header><main>{body}</main></body></html>
"""


def handlers(oauth: AgentOAuth) -> list[tuple[Any, ...]]:
    """The routes under the server's base URL (the extension prefixes it)."""
    kwargs = {"oauth": oauth}
    return [
        (rf"/{OAUTH_PATH}/authorize", AuthorizeHandler, kwargs),
        (rf"/{OAUTH_PATH}/token", TokenHandler, kwargs),
        (rf"/{OAUTH_PATH}/register", RegisterHandler, kwargs),
        (rf"/{OAUTH_PATH}/revoke", RevokeHandler, kwargs),
        (rf"/{OAUTH_PATH}/grants", GrantListHandler),
        (rf"/{OAUTH_PATH}/grants/(?P<grant_id>[^/]+)", GrantHandler),
        (rf"/\.well-known/oauth-protected-resource/{MCP_PATH}", ResourceMetadataHandler, kwargs),
        (r"/\.well-known/oauth-authorization-server", ServerMetadataHandler, kwargs),
        (r"/\.well-known/openid-configuration", ServerMetadataHandler, kwargs),
    ]


def origin_handlers(oauth: AgentOAuth, base_url: str) -> list[tuple[str, Any, dict[str, Any]]]:
    """The routes at the origin, whatever the base URL: the well-known forms with the base URL's path
    inserted (RFC 8414 section 3.1, RFC 9728 section 3.1), and the path-less ones clients also try."""
    kwargs = {"oauth": oauth}
    base = "/" + base_url.strip("/") if base_url.strip("/") else ""
    escaped = re.escape(base)
    rules: list[tuple[str, Any, dict[str, Any]]] = [
        (rf"/\.well-known/oauth-protected-resource{escaped}/{MCP_PATH}", ResourceMetadataHandler, kwargs),
        (rf"/\.well-known/oauth-authorization-server{escaped}", ServerMetadataHandler, kwargs),
        (rf"/\.well-known/openid-configuration{escaped}", ServerMetadataHandler, kwargs),
    ]
    if base:  # clients that drop the issuer's path look at the origin's root (claude-code #95270)
        rules.append((r"/\.well-known/oauth-authorization-server", ServerMetadataHandler, kwargs))
    else:
        rules.append((r"/\.well-known/oauth-protected-resource", ResourceMetadataHandler, kwargs))
    return rules
