"""The hub's agent OAuth service as a web application: thin handlers over :class:`.service.HubOAuthService`.

Routes, under the service's prefix (``JUPYTERHUB_SERVICE_PREFIX``, ``/services/agent-oauth/``): the consent
page ``authorize`` (behind the hub's own login: ``jupyterhub.services.auth.HubOAuth``, so the hub's
identity provider and its MFA apply), ``token``, ``register``, ``revoke`` (public, RFC 6749/7591/7009),
``jwks`` and ``revoked`` (what the single-user servers read), ``oauth_callback`` (the hub's OAuth), and the
person's connected apps at the prefix itself. At the origin (routed here with ``c.Proxy.extra_routes``):
``/.well-known/oauth-authorization-server`` and ``/.well-known/openid-configuration`` (RFC 8414).
"""

from __future__ import annotations

import asyncio
import html
import ipaddress
import json
import os
import secrets
import signal
from typing import Any
from urllib.parse import urlsplit

from jupyter_server.utils import url_path_join
from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets import Unicode
from traitlets.config import Application

from ..compat import status_reason
from ..errors import AgentToolsError
from ..handlers.oauth import CONSENT_CSP, PAGE, OAuthAnswers, consent_form, consent_of
from ..oauth.core import AuthorizationRequest, OAuthError, authorization_server_metadata
from .service import HubOAuthService, server_of


class _Service:
    oauth: HubOAuthService
    prefix: str

    def initialize(self, oauth: HubOAuthService, prefix: str) -> None:
        self.oauth, self.prefix = oauth, prefix

    @property
    def origin(self) -> str:
        request = self.request  # type: ignore[attr-defined]
        return f"{request.protocol}://{request.host}"

    @property
    def issuer(self) -> str:
        return self.oauth.issuer(self.origin)

    def endpoints(self) -> dict[str, str]:
        base = self.issuer + self.prefix
        return {name: base + name for name in ("authorize", "token", "register", "revoke")}


class _Public(_Service, OAuthAnswers):
    def prepare(self) -> None:
        if not self.oauth.active:
            raise web.HTTPError(404, "OAuth sign-in for agents is turned off (c.AgentOAuth.enabled)")


class MetadataHandler(_Public):
    """RFC 8414 (and OpenID discovery's location of it)."""

    def get(self) -> None:
        metadata = authorization_server_metadata(
            self.issuer, self.endpoints(), cimd=self.oauth.accepts_documents
        )
        metadata["jwks_uri"] = self.issuer + self.prefix + "jwks"
        self.answer(metadata)


class JwksHandler(_Public):
    def get(self) -> None:
        self.set_header("Cache-Control", "max-age=300")
        self.answer(self.oauth.jwks())


class RevokedHandler(_Public):
    """The grants revoked while their access tokens may still live (servers refuse their tokens)."""

    async def get(self) -> None:
        self.answer({"revoked": await self.oauth.revoked()})


class RegisterHandler(_Public):
    async def post(self) -> None:
        try:
            metadata = json.loads(self.request.body or b"null")
        except ValueError:
            raise OAuthError("invalid_client_metadata", "the body must be JSON") from None
        self.answer(await self.oauth.register(metadata), 201)


class TokenHandler(_Public):
    async def post(self) -> None:
        self.answer(await self.oauth.token(self.form(), ""))


class RevokeHandler(_Public):
    async def post(self) -> None:
        await self.oauth.revoke(self.form())
        self.answer({})


class _Page(_Service, HubOAuthenticated, web.RequestHandler):
    """A page of the person, signed in at the hub."""

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Content-Security-Policy", CONSENT_CSP)
        self.set_header("Cache-Control", "no-store")

    def page(self, title: str, body: str, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(PAGE.format(title=html.escape(title), body=body))

    @property
    def person(self) -> str:
        return str(self.current_user["name"])

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None))[1]
        message = error.log_message if isinstance(error, web.HTTPError) else None
        self.page("Error", f"<p>{html.escape(message or status_reason(self))}</p>", status_code)


class AuthorizeHandler(_Page):
    """The consent page (GET) and the person's answer (POST)."""

    @web.authenticated
    async def get(self) -> None:
        if not self.oauth.active:
            raise web.HTTPError(404, "OAuth sign-in for agents is turned off")
        params = {k: self.get_query_argument(k) for k in self.request.query_arguments}
        try:
            request, target = await self.oauth.request_for(params, self.person, self.origin)
        except OAuthError as e:
            if not e.redirect:
                self.page("Sign-in refused", f"<p>{html.escape(e.description)}</p>", e.status)
                return
            client = await self.oauth.client(params.get("client_id"))
            redirect = params.get("redirect_uri") or client.redirect_uris[0]
            fake = AuthorizationRequest(client, redirect, params.get("state"), "", frozenset(), None)
            self.redirect(self.oauth.error_redirect(fake, e, self.issuer))
            return
        self._consent(request, target)

    def _consent(
        self, request: AuthorizationRequest, target: str, error: str = "", status: int = 200
    ) -> None:
        body = consent_form(request, self.oauth.max_grant_lifetime, self.xsrf_form_html(), error, target)
        self.page("Connect an agent", body, status)

    @web.authenticated
    async def post(self) -> None:
        if not self.oauth.active:
            raise web.HTTPError(404, "OAuth sign-in for agents is turned off")
        request_id = self.get_body_argument("request", "")
        pending: AuthorizationRequest | None = self.oauth.pending.get(request_id)
        target = "your server"
        if pending is not None:
            user, server = server_of(pending.resource or "", self.origin, self.oauth.hub_base)
            if user != self.person:
                raise web.HTTPError(403, "This sign-in request is another person's.")
            target = f"{user}'s server{' ' + repr(server) if server else ''}"
        consent = None
        if self.get_body_argument("decision", "") == "approve":
            try:
                consent = consent_of(self, self.oauth.max_grant_lifetime)
            except ValueError as e:
                if pending is None:
                    raise web.HTTPError(
                        400, "This sign-in request expired: start again from the app."
                    ) from None
                self._consent(pending, target, str(e), 400)
                return
        try:
            target = self.oauth.decide(request_id, consent, self.person, self.issuer)
        except AgentToolsError as e:
            self.page("Sign-in expired", f"<p>{html.escape(e.message)}</p>", e.status)
            return
        self.redirect(target)


class AppsHandler(_Page):
    """The person's connected apps (GET) and disconnecting one (POST ``grant``)."""

    @web.authenticated
    async def get(self) -> None:
        e = html.escape
        rows = "".join(
            f"<tr><td>{e(g['client_name'])}</td><td>{e(g['server'])}</td><td>{e(' '.join(g['scopes']))}</td>"
            f"<td>{e(g['status'])}</td><td>{e(g['expires'] or '')}</td><td>"
            + (
                f"<form method='post' action=''>{self.xsrf_form_html()}<input type='hidden' name='grant' "
                f"value='{g['id']}'><button type='submit'>Disconnect</button></form>"
                if g["status"] == "active"
                else ""
            )
            + "</td></tr>"
            for g in await self.oauth.grants_of(self.person)
        )
        table = (
            "<table><tr><th>App</th><th>Server</th><th>Scopes</th><th>Status</th><th>Until</th><th></th></tr>"
            f"{rows}</table>"
            if rows
            else "<p>No app is connected.</p>"
        )
        self.page("Connected apps", table)

    @web.authenticated
    async def post(self) -> None:
        grant = self.get_body_argument("grant", "")
        if not grant.isdigit() or len(grant) > 18:
            raise web.HTTPError(404, f"no connected app with id {grant!r}")
        try:
            await self.oauth.revoke_own(self.person, int(grant))
        except OAuthError as e:
            raise web.HTTPError(e.status, e.description) from None
        self.redirect(self.request.path)


def make_app(oauth: HubOAuthService, prefix: str, hub_auth: HubOAuth) -> web.Application:
    kwargs = {"oauth": oauth, "prefix": prefix}
    escaped = prefix.replace(".", r"\.")
    routes: list[Any] = [
        (r"/\.well-known/oauth-authorization-server", MetadataHandler, kwargs),
        (r"/\.well-known/openid-configuration", MetadataHandler, kwargs),
        (escaped + r"\.well-known/oauth-authorization-server", MetadataHandler, kwargs),
        (escaped + "authorize", AuthorizeHandler, kwargs),
        (escaped + "token", TokenHandler, kwargs),
        (escaped + "register", RegisterHandler, kwargs),
        (escaped + "revoke", RevokeHandler, kwargs),
        (escaped + "jwks", JwksHandler, kwargs),
        (escaped + "revoked", RevokedHandler, kwargs),
        (escaped + "oauth_callback", HubOAuthCallbackHandler),
        (escaped + "?", AppsHandler, kwargs),
    ]
    return web.Application(
        routes,
        hub_auth=hub_auth,
        cookie_secret=secrets.token_bytes(32),
        xsrf_cookies=True,
        login_url=hub_auth.login_url,
    )


class HubOAuthApp(Application):
    """``python -m jupyter_agent_tools.hub_oauth``: run as a JupyterHub service (the hub passes its URL,
    prefix and API token in the environment)."""

    name = "jupyter-agent-hub-oauth"
    description = "OAuth sign-in for MCP clients on a JupyterHub (jupyter-agent-tools)"
    classes = [HubOAuthService]
    config_file = Unicode("", help="A Python configuration file (c.HubOAuthService.*, c.AgentOAuth.*)").tag(
        config=True
    )
    ip = Unicode(
        "",
        help="The address the service listens on. Empty: the host of its URL (JUPYTERHUB_SERVICE_URL) when "
        "that is an IP address or localhost, else every interface (a URL like http://hub:10101 names a "
        "Kubernetes service, not an address of the pod).",
    ).tag(config=True)
    aliases = {"config": "HubOAuthApp.config_file", "ip": "HubOAuthApp.ip"}

    def address(self, url: str) -> tuple[str, int]:
        """Where to listen for the service's ``url``."""
        where = urlsplit(url)
        host = where.hostname or ""
        if not self.ip:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                host = host if host == "localhost" else ""
        return self.ip or host, where.port or (443 if where.scheme == "https" else 80)

    def start(self) -> None:
        if self.config_file:
            self.load_config_file(self.config_file)
        asyncio.run(self.serve())

    async def serve(self) -> None:
        oauth = HubOAuthService(parent=self)
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/agent-oauth/")
        prefix = "/" + prefix.strip("/") + "/"
        url = os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101")
        hub_auth = HubOAuth(api_token=os.environ["JUPYTERHUB_API_TOKEN"], cache_max_age=60)
        app = make_app(oauth, prefix, hub_auth)
        host, port = self.address(url)
        server = HTTPServer(app, xheaders=True)
        server.listen(port, host)
        self.log.info("agent OAuth service on %s (issuer %s)", url_path_join(url, prefix), oauth.public_url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        server.stop()
        oauth.close()


def main() -> None:
    HubOAuthApp.launch_instance()
