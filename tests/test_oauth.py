"""OAuth sign-in for MCP clients (issue 45 A): the server is the authorization server of its MCP endpoint.

A real server (subprocess, agent tokens on) and real clients: the official MCP Python SDK's
``OAuthClientProvider`` signs in through the consent page (driven by an HTTP client that holds the server's
token, as the person's logged-in browser would) and calls tools with the scopes the person chose; raw HTTP
checks each refusal the specs name (``invalid_grant`` for a bad PKCE verifier, another redirect URI, a
replayed code, a reused refresh token; ``invalid_token`` for an ended access token; ``insufficient_scope``).
The quick tier checks the pure core and the service with an injected clock (a code's 60 seconds).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import re
import secrets
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from mcp import ClientSession
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)

from jupyter_agent_tools.oauth import core
from jupyter_agent_tools.testing.server import Server, jupyter_server

pytestmark = pytest.mark.timeout(300)

AGENT_TOKENS = [
    "--ServerApp.identity_provider_class=jupyter_agent_tools.auth.AgentIdentityProvider",
    "--ServerApp.authorizer_class=jupyter_agent_tools.auth.AgentAuthorizer",
    "--KernelPool.size=0",
]
REDIRECT = "http://127.0.0.1:33418/callback"
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("oauth-root")
    (root / "reports").mkdir()
    (root / "reports" / "r.txt").write_text("report")
    with jupyter_server(root_dir=root, extra_args=AGENT_TOKENS) as s:
        yield s


def token_db(server: Server) -> Path:
    assert server.runtime_dir is not None
    return server.runtime_dir.parent / "data" / "jupyter_agent_tools" / "agent_tokens.db"


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


class Person:
    """The person at the consent page: opens the authorize URL with the server's token (their login), and
    answers the form with ``choices`` (one per sign-in, in order)."""

    def __init__(self, server: Server, choices: list[dict[str, Any]]):
        self.server, self.choices, self.pages, self.location = server, choices, 0, ""

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"token {self.server.token}"}

    async def redirect(self, url: str) -> None:
        async with httpx.AsyncClient() as client:
            page = await client.get(url, headers=self.auth)
            assert page.status_code == 200, page.text
            assert (
                "Content-Security-Policy" in page.headers
                and "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
            )
            self.pages += 1
            form = {"request": consent_request_id(page.text), **self.choices.pop(0)}
            answered = await client.post(url, data=form, headers=self.auth)
        assert answered.status_code == 302, answered.text
        self.location = answered.headers["Location"]

    async def callback(self) -> AuthorizationCodeResult:
        query = parse_qs(urlsplit(self.location).query)
        return AuthorizationCodeResult(code=query["code"][0], state=query["state"][0], iss=query["iss"][0])


def consent_request_id(page: str) -> str:
    found = re.search(r'name="request" value="([^"]+)"', page)
    assert found, page
    return found.group(1)


class Memory:
    """The SDK's token storage, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def approve(
    *scopes: str, paths: str = "", ask: tuple[str, ...] = (), lifetime: str = "1 day"
) -> dict[str, Any]:
    return {
        "decision": "approve",
        "scope": list(scopes),
        "paths": paths,
        "ask": list(ask),
        "lifetime": lifetime,
    }


# -- the resource server's challenge and the metadata ---------------------------------------------------


def test_no_credentials_is_a_401_challenge_and_wrong_ones_keep_the_403(server: Server) -> None:
    mcp = server.url + "api/agent/mcp"
    with httpx.Client() as client:
        answer = client.post(mcp, json=PING)
        assert answer.status_code == 401
        challenge = answer.headers["WWW-Authenticate"]
        metadata_url = server.url + ".well-known/oauth-protected-resource/api/agent/mcp"
        assert challenge == f'Bearer resource_metadata="{metadata_url}", scope="read edit execute"'
        assert "Authorization: token" in answer.json()["message"]  # the static header is still explained

        wrong = client.post(mcp, json=PING, headers={"Authorization": "token nope"})
        assert wrong.status_code == 403 and "WWW-Authenticate" not in wrong.headers
        assert "not accepted by this server" in wrong.json()["message"]
        unknown_agent = client.post(mcp, json=PING, headers={"Authorization": "Bearer jat_nope"})
        assert unknown_agent.status_code == 403 and "WWW-Authenticate" not in unknown_agent.headers

        # the static header works as before
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        ok = client.post(
            mcp, json=init, headers={"Authorization": f"token {server.token}", "Accept": "application/json"}
        )
        assert ok.status_code == 200 and ok.json()["result"]["protocolVersion"] == "2025-06-18"

        resource = client.get(metadata_url).json()
        origin = server.url.rstrip("/")
        assert resource["resource"] == origin + "/api/agent/mcp"
        assert resource["authorization_servers"] == [origin]
        assert client.get(origin + "/.well-known/oauth-protected-resource").json() == resource
        for where in ("oauth-authorization-server", "openid-configuration"):
            found = client.get(f"{origin}/.well-known/{where}").json()
            assert found["issuer"] == origin
            assert found["code_challenge_methods_supported"] == ["S256"]
            assert found["token_endpoint"] == origin + "/api/agent/oauth/token"
            assert found["authorization_response_iss_parameter_supported"] is True


def test_the_consent_page_is_behind_the_login_and_never_an_agents(server: Server) -> None:
    with httpx.Client() as client:
        url = server.url + "api/agent/oauth/authorize?client_id=x&response_type=code"
        login = client.get(url, follow_redirects=False)
        assert login.status_code == 302 and login.headers["Location"].startswith("/login?next=")
        assert "authorize%3Fclient_id%3Dx" in login.headers["Location"]
        made = client.post(
            server.url + "api/agent/tokens",
            json={"name": "bot", "scopes": ["read", "edit", "execute"]},
            headers={"Authorization": f"token {server.token}"},
        )
        agent = {"Authorization": f"token {made.json()['token']}"}
        refused = client.get(url, headers=agent, follow_redirects=False)
        assert refused.status_code == 403
        posted = client.post(url, data={"request": "x", "decision": "approve"}, headers=agent)
        assert posted.status_code == 403
        unknown = client.get(url, headers={"Authorization": f"token {server.token}"})
        assert unknown.status_code == 401 and "not registered" in unknown.text


# -- the official SDK signs in -----------------------------------------------------------------------


async def test_the_mcp_sdk_signs_in_and_gets_the_scopes_the_person_chose(server: Server) -> None:
    """OAuthClientProvider: 401 -> metadata -> registration -> consent (read only) -> token; a read tool
    works, eval answers 403 insufficient_scope, the SDK signs in again (the person adds execute) and the
    eval runs; the access token is an agent token named after the app."""
    person = Person(server, [approve("read"), approve("read", "execute")])
    metadata = OAuthClientMetadata(
        client_name="Test Agent (SDK)", redirect_uris=[REDIRECT], token_endpoint_auth_method="none"
    )
    storage = Memory()
    provider = OAuthClientProvider(
        server.url + "api/agent/mcp", metadata, storage, person.redirect, person.callback
    )
    async with (
        create_mcp_http_client(auth=provider) as http,
        streamable_http_client(server.url + "api/agent/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = await session.call_tool("file_list", {"path": "reports"})
        assert not listed.is_error and "r.txt" in str(listed.content), listed
        assert person.pages == 1 and storage.tokens is not None
        assert storage.tokens.scope == "read" and storage.tokens.expires_in == 3600
        assert storage.tokens.refresh_token and storage.tokens.refresh_token.startswith("jrt_")
        ran = await session.call_tool("eval", {"cells": [{"code": "print(6 * 7)"}]})
        assert person.pages == 2  # the step-up: the person was asked again
        assert not ran.is_error and "42" in str(ran.content), ran
        assert storage.tokens.scope == "read execute"
    with httpx.Client() as client:
        listed = client.get(
            server.url + "api/agent/tokens", headers={"Authorization": f"token {server.token}"}
        )
    tokens = {t["name"]: t for t in listed.json()["tokens"] if t["name"].startswith("oauth-test-agent-sdk-")}
    # the step-up's sign-in replaced the first (one app, one grant); both expire within the hour
    assert [(t["scopes"], t["status"]) for t in tokens.values()] == [
        (["read"], "revoked"),
        (["read", "execute"], "active"),
    ], tokens
    assert all(t["expires"] for t in tokens.values())


def test_under_a_base_url_the_sdk_finds_the_path_inserted_metadata(tmp_path: Path) -> None:
    """``base_url=/jupyter/``: the issuer is ``<origin>/jupyter``; the 401 points under the base URL, the
    authorization server metadata is at the origin with the path inserted (where the SDK looks), at the
    origin's root (clients that drop the issuer's path), and under the base URL (OpenID's appended form)."""
    with jupyter_server(root_dir=tmp_path, extra_args=[*AGENT_TOKENS, "--ServerApp.base_url=/jupyter/"]) as s:
        origin = s.url.rstrip("/")  # (the harness's URL is the origin's)
        mcp = f"{origin}/jupyter/api/agent/mcp"
        with httpx.Client() as client:
            challenge = client.post(mcp, json=PING).headers["WWW-Authenticate"]
            assert (
                f'resource_metadata="{origin}/jupyter/.well-known/oauth-protected-resource/api/agent/mcp"'
                in (challenge)
            )
            for path in (
                "/jupyter/.well-known/oauth-protected-resource/api/agent/mcp",
                "/.well-known/oauth-protected-resource/jupyter/api/agent/mcp",
            ):
                assert client.get(origin + path).json()["resource"] == mcp, path
            for path in (
                "/.well-known/oauth-authorization-server/jupyter",
                "/.well-known/openid-configuration/jupyter",
                "/jupyter/.well-known/openid-configuration",
                "/.well-known/oauth-authorization-server",
            ):
                found = client.get(origin + path).json()
                assert found["issuer"] == origin + "/jupyter", path
                assert found["token_endpoint"] == origin + "/jupyter/api/agent/oauth/token"
            assert client.get(origin + "/.well-known/oauth-protected-resource").status_code == 404

        async def sign_in() -> str:
            person = Person(s, [approve("read")])
            metadata = OAuthClientMetadata(
                client_name="Sub", redirect_uris=[REDIRECT], token_endpoint_auth_method="none"
            )
            provider = OAuthClientProvider(mcp, metadata, Memory(), person.redirect, person.callback)
            async with (
                create_mcp_http_client(auth=provider) as http,
                streamable_http_client(mcp, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                listed = await session.call_tool("file_list", {})
                assert not listed.is_error, listed
            return person.location

        location = asyncio.run(sign_in())
        assert parse_qs(urlsplit(location).query)["iss"] == [origin + "/jupyter"]


CIMD_URL = "https://agent.example/oauth/client.json"


def test_a_client_id_metadata_document_names_the_app_by_its_host(tmp_path: Path) -> None:
    """CIMD: the client_id is the URL of the app's metadata document; pinned here (a server without
    egress), never fetched. The SDK uses it instead of registering, and the consent page names the host."""
    document = {
        "client_id": CIMD_URL,
        "client_name": "Example Agent",
        "redirect_uris": [REDIRECT],
        "token_endpoint_auth_method": "none",
    }
    config = tmp_path / "pinned.py"
    config.write_text(
        f"c.AgentOAuth.client_metadata_documents = {{{CIMD_URL!r}: {document!r}}}\n"
        "c.AgentOAuth.fetch_client_metadata = False\n"
    )
    with jupyter_server(root_dir=tmp_path, extra_args=[*AGENT_TOKENS, f"--config={config}"]) as s:
        mcp = s.url + "api/agent/mcp"
        with httpx.Client() as client:
            found = client.get(s.url + ".well-known/oauth-authorization-server").json()
            assert found["client_id_metadata_document_supported"] is True
            other = "https://other.example/client.json"
            _, challenge = pkce()
            query = urlencode({"client_id": other, "response_type": "code", "redirect_uri": REDIRECT,
                               "code_challenge": challenge, "code_challenge_method": "S256"})  # fmt: skip
            refused = client.get(
                s.url + "api/agent/oauth/authorize?" + query, headers={"Authorization": f"token {s.token}"}
            )
            assert refused.status_code == 401 and "is not pinned" in refused.text

        pages: list[str] = []

        class Looking(Person):
            async def redirect(self, url: str) -> None:
                async with httpx.AsyncClient() as client:
                    pages.append((await client.get(url, headers=self.auth)).text)
                await super().redirect(url)

        async def sign_in() -> None:
            person = Looking(s, [approve("read")])
            metadata = OAuthClientMetadata(
                client_name="ignored", redirect_uris=[REDIRECT], token_endpoint_auth_method="none"
            )
            provider = OAuthClientProvider(
                mcp, metadata, Memory(), person.redirect, person.callback, client_metadata_url=CIMD_URL
            )
            async with (
                create_mcp_http_client(auth=provider) as http,
                streamable_http_client(mcp, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                assert not (await session.call_tool("file_list", {})).is_error

        asyncio.run(sign_in())
        assert "<strong>Example Agent</strong> (from <strong>agent.example</strong>)" in pages[0]
        assert "unverified" not in pages[0]
        with httpx.Client() as client:
            names = [
                t["name"]
                for t in client.get(
                    s.url + "api/agent/tokens", headers={"Authorization": f"token {s.token}"}
                ).json()["tokens"]
            ]
        assert names == ["oauth-example-agent-1"]


# -- the flow by hand: every refusal ---------------------------------------------------------------------


class Flow:
    """One registered client, signing in by hand."""

    def __init__(self, server: Server, client: httpx.Client, redirect: str = REDIRECT):
        self.server, self.http, self.redirect = server, client, redirect
        self.origin = server.url.rstrip("/")
        answer = client.post(
            self.origin + "/api/agent/oauth/register",
            json={
                "client_name": "Hand <b>made</b>",
                "redirect_uris": [redirect],
                "token_endpoint_auth_method": "none",
            },
        )
        assert answer.status_code == 201, answer.text
        self.client_id = answer.json()["client_id"]

    def authorize_url(self, challenge: str, **extra: str) -> str:
        params = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": self.redirect,
            "state": "s1",
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "resource": self.origin + "/api/agent/mcp",
            **extra,
        }
        return self.origin + "/api/agent/oauth/authorize?" + urlencode(params)

    def code(self, challenge: str, choice: dict[str, Any], **extra: str) -> dict[str, str]:
        """The redirect's query after the person answered ``choice``."""
        auth = {"Authorization": f"token {self.server.token}"}
        url = self.authorize_url(challenge, **extra)
        page = self.http.get(url, headers=auth)
        assert page.status_code == 200, page.text
        assert "Hand &lt;b&gt;made&lt;/b&gt;" in page.text and "unverified app" in page.text
        answered = self.http.post(
            url, data={"request": consent_request_id(page.text), **choice}, headers=auth
        )
        assert answered.status_code == 302, answered.text
        location = answered.headers["Location"]
        assert location.startswith(self.redirect.rsplit(":", 1)[0])
        return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}

    def token(self, **form: str) -> httpx.Response:
        return self.http.post(
            self.origin + "/api/agent/oauth/token", data={"client_id": self.client_id, **form}
        )

    def exchange(self, code: str, verifier: str, redirect: str | None = None) -> httpx.Response:
        return self.token(
            grant_type="authorization_code",
            code=code,
            code_verifier=verifier,
            redirect_uri=redirect or self.redirect,
        )

    def signed_in(self, *scopes: str) -> dict[str, Any]:
        verifier, challenge = pkce()
        answer = self.exchange(self.code(challenge, approve(*scopes))["code"], verifier)
        assert answer.status_code == 200, answer.text
        assert answer.headers["Cache-Control"] == "no-store"
        return dict(answer.json())

    def mcp(self, access: str, body: Any = PING) -> httpx.Response:
        headers = {"Authorization": f"Bearer {access}", "Accept": "application/json, text/event-stream"}
        return self.http.post(self.origin + "/api/agent/mcp", json=body, headers=headers)


def initialize(flow: Flow, access: str) -> dict[str, str]:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    answer = flow.mcp(access, init)
    assert answer.status_code == 200, answer.text
    headers = {"Mcp-Session-Id": answer.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-06-18"}
    headers.update({"Authorization": f"Bearer {access}", "Accept": "application/json"})
    flow.http.post(
        flow.origin + "/api/agent/mcp",
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        headers=headers,
    )
    return headers


def test_codes_are_bound_single_use_and_pkce_checked(server: Server) -> None:
    with httpx.Client() as client:
        flow = Flow(server, client)
        verifier, challenge = pkce()
        query = flow.code(challenge, approve("read"))
        assert query["state"] == "s1" and query["iss"] == flow.origin
        wrong = flow.exchange(query["code"], pkce()[0])
        assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"
        assert "PKCE" in wrong.json()["error_description"]
        burned = flow.exchange(query["code"], verifier)  # a failed try uses the code up
        assert burned.status_code == 400 and burned.json()["error"] == "invalid_grant"

        query = flow.code(challenge, approve("read"))
        other = flow.exchange(query["code"], verifier, redirect="http://127.0.0.1:9/elsewhere")
        assert other.status_code == 400 and other.json()["error"] == "invalid_grant"
        assert "redirect_uri" in other.json()["error_description"]

        query = flow.code(challenge, approve("read"))
        stranger = flow.http.post(
            flow.origin + "/api/agent/oauth/token",
            data={"grant_type": "authorization_code", "code": query["code"], "code_verifier": verifier,
                  "redirect_uri": REDIRECT, "client_id": Flow(server, client).client_id},
        )  # fmt: skip
        assert stranger.status_code == 400 and stranger.json()["error"] == "invalid_grant"

        # a loopback redirect on another port is the same app (RFC 8252); the code works once
        query = flow.code(challenge, approve("read"), redirect_uri="http://127.0.0.1:40001/callback")
        good = flow.exchange(query["code"], verifier, redirect="http://127.0.0.1:40001/callback")
        assert good.status_code == 200, good.text
        access = good.json()["access_token"]
        assert flow.mcp(access).status_code == 400  # authenticated: a ping without a session is the MCP's 400
        replay = flow.exchange(query["code"], verifier, redirect="http://127.0.0.1:40001/callback")
        assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
        ended = flow.mcp(access)  # a replayed code revokes what it gave (RFC 6749 section 4.1.2)
        assert ended.status_code == 401 and 'error="invalid_token"' in ended.headers["WWW-Authenticate"]

        for bad, error in (
            ({"code_challenge_method": "plain"}, "invalid_request"),
            ({"code_challenge": ""}, "invalid_request"),
            ({"resource": "http://example.com/mcp"}, "invalid_target"),
        ):
            url = flow.authorize_url(challenge, **bad)
            answer = client.get(
                url, headers={"Authorization": f"token {server.token}"}, follow_redirects=False
            )
            assert answer.status_code == 302, answer.text
            query = {k: v[0] for k, v in parse_qs(urlsplit(answer.headers["Location"]).query).items()}
            assert query["error"] == error and query["state"] == "s1" and query["iss"] == flow.origin
        foreign = flow.authorize_url(challenge, redirect_uri="https://evil.example/cb")
        shown = client.get(
            foreign, headers={"Authorization": f"token {server.token}"}, follow_redirects=False
        )
        assert shown.status_code == 400 and "is not one of this app" in shown.text  # never redirected there

        denied = flow.code(challenge, {"decision": "deny"})
        assert denied["error"] == "access_denied" and denied["state"] == "s1" and "code" not in denied


def test_refresh_rotates_and_a_reused_refresh_token_ends_the_grant(server: Server) -> None:
    with httpx.Client() as client:
        flow = Flow(server, client)
        first = flow.signed_in("read")
        second = flow.token(grant_type="refresh_token", refresh_token=first["refresh_token"])
        assert second.status_code == 200, second.text
        second_tokens = second.json()
        assert second_tokens["refresh_token"] != first["refresh_token"]
        assert second_tokens["access_token"] != first["access_token"]
        old = flow.mcp(first["access_token"])  # the replaced access token no longer works
        assert old.status_code == 401 and 'error="invalid_token"' in old.headers["WWW-Authenticate"]
        assert flow.mcp(second_tokens["access_token"]).status_code == 400  # works (no session: MCP's 400)

        reused = flow.token(grant_type="refresh_token", refresh_token=first["refresh_token"])
        assert reused.status_code == 400 and reused.json()["error"] == "invalid_grant"
        assert flow.mcp(second_tokens["access_token"]).status_code == 401  # the whole grant ended
        after = flow.token(grant_type="refresh_token", refresh_token=second_tokens["refresh_token"])
        assert after.status_code == 400 and after.json()["error"] == "invalid_grant"


def test_revocation_expiry_and_insufficient_scope(server: Server) -> None:
    with httpx.Client() as client:
        flow = Flow(server, client)
        tokens = flow.signed_in("read")
        headers = initialize(flow, tokens["access_token"])
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "eval", "arguments": {"cells": [{"code": "1"}]}},
        }
        refused = client.post(flow.origin + "/api/agent/mcp", json=call, headers=headers)
        assert refused.status_code == 403, refused.text
        challenge = refused.headers["WWW-Authenticate"]
        assert 'error="insufficient_scope"' in challenge and 'scope="read execute"' in challenge
        assert "resource_metadata=" in challenge and "Nothing was done" in refused.text

        revoked = client.post(
            flow.origin + "/api/agent/oauth/revoke", data={"token": tokens["refresh_token"]}
        )
        assert revoked.status_code == 200
        assert flow.mcp(tokens["access_token"]).status_code == 401
        again = flow.token(grant_type="refresh_token", refresh_token=tokens["refresh_token"])
        assert again.json()["error"] == "invalid_grant"
        unknown = client.post(flow.origin + "/api/agent/oauth/revoke", data={"token": "whatever"})
        assert unknown.status_code == 200  # RFC 7009: nothing is said about unknown tokens

        tokens = flow.signed_in("read")
        with contextlib.closing(sqlite3.connect(token_db(server))) as db, db:  # its hour passes
            db.execute(
                "UPDATE agent_tokens SET expires = ? WHERE token_hash = ?",
                (time.time() - 1, hashlib.sha256(tokens["access_token"].encode()).hexdigest()),
            )
        expired = flow.mcp(tokens["access_token"])
        assert expired.status_code == 401 and 'error="invalid_token"' in expired.headers["WWW-Authenticate"]
        assert "expired" in expired.json()["message"]
        renewed = flow.token(grant_type="refresh_token", refresh_token=tokens["refresh_token"])
        assert renewed.status_code == 200 and flow.mcp(renewed.json()["access_token"]).status_code == 400

        # the person revokes the app's agent token (panel, CLI): the refresh token ends with it
        name = next(
            t["name"]
            for t in client.get(
                flow.origin + "/api/agent/tokens", headers={"Authorization": f"token {server.token}"}
            ).json()["tokens"]
            if t["status"] == "active" and t["name"].startswith("oauth-hand-b-made-b-")
        )
        gone = client.delete(
            flow.origin + f"/api/agent/tokens/{name}", headers={"Authorization": f"token {server.token}"}
        )
        assert gone.status_code == 200
        after = flow.token(grant_type="refresh_token", refresh_token=renewed.json()["refresh_token"])
        assert after.status_code == 400 and after.json()["error"] == "invalid_grant"


def test_the_person_lists_and_disconnects_connected_apps(server: Server) -> None:
    owner = {"Authorization": f"token {server.token}"}
    with httpx.Client() as client:
        flow = Flow(server, client)
        tokens = flow.signed_in("read", "edit")
        listed = client.get(flow.origin + "/api/agent/oauth/grants", headers=owner)
        assert listed.status_code == 200
        mine = [g for g in listed.json()["grants"] if g["client_id"] == flow.client_id]
        assert len(mine) == 1 and mine[0]["status"] == "active" and mine[0]["scopes"] == ["read", "edit"]
        assert mine[0]["client_name"] == "Hand <b>made</b>" and mine[0]["verified"] is False
        assert mine[0]["agent"].startswith("oauth-hand-b-made-b-")
        assert tokens["access_token"] not in listed.text and tokens["refresh_token"] not in listed.text
        agent = {"Authorization": f"Bearer {tokens['access_token']}"}
        assert client.get(flow.origin + "/api/agent/oauth/grants", headers=agent).status_code == 403
        assert (
            client.delete(flow.origin + f"/api/agent/oauth/grants/{mine[0]['id']}", headers=agent).status_code
            == 403
        )

        gone = client.delete(flow.origin + f"/api/agent/oauth/grants/{mine[0]['id']}", headers=owner)
        assert gone.status_code == 200 and gone.json()["status"] == "revoked"
        assert gone.json()["revoked_why"] == "revoked by the person"
        assert flow.mcp(tokens["access_token"]).status_code == 401
        refresh = flow.token(grant_type="refresh_token", refresh_token=tokens["refresh_token"])
        assert refresh.json()["error"] == "invalid_grant"
        for missing in ("999999", "x", "1" * 40):
            answer = client.delete(flow.origin + f"/api/agent/oauth/grants/{missing}", headers=owner)
            assert answer.status_code == 404 and "no connected app" in answer.json()["message"]


def test_registration_is_for_public_loopback_or_https_clients(server: Server) -> None:
    url = server.url + "api/agent/oauth/register"
    with httpx.Client() as client:
        for body, error in (
            ({"redirect_uris": ["http://example.com/cb"]}, "invalid_redirect_uri"),
            ({"redirect_uris": ["https://example.com/cb#x"]}, "invalid_redirect_uri"),
            ({"redirect_uris": []}, "invalid_redirect_uri"),
            (
                {"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "client_secret_basic"},
                "invalid_client_metadata",
            ),
            ({"redirect_uris": [REDIRECT], "grant_types": ["client_credentials"]}, "invalid_client_metadata"),
        ):
            answer = client.post(url, json=body)
            assert answer.status_code == 400 and answer.json()["error"] == error, (body, answer.text)
        ok = client.post(url, json={"redirect_uris": ["https://app.example/cb", "http://[::1]/cb"]})
        assert ok.status_code == 201 and ok.json()["token_endpoint_auth_method"] == "none"
        assert client.post(url, content=b"{", headers={"Content-Type": "application/json"}).status_code == 400
        form = client.post(server.url + "api/agent/oauth/token", json={"grant_type": "authorization_code"})
        assert form.status_code == 400 and form.json()["error"] == "invalid_request"
        grant = client.post(server.url + "api/agent/oauth/token", data={"grant_type": "password"})
        assert grant.json()["error"] == "unsupported_grant_type"


# -- the quick tier: the pure core and the service with an injected clock ---------------------------------


@pytest.mark.quick
def test_core_pkce_redirects_and_challenges() -> None:
    verifier, challenge = pkce()
    assert core.check_challenge(challenge, "S256") == challenge
    assert core.verifier_matches(verifier, challenge)
    assert not core.verifier_matches(verifier + "x", challenge)
    assert not core.verifier_matches("short", core.s256("short"))  # RFC 7636: 43 to 128 characters
    with pytest.raises(core.OAuthError):
        core.check_challenge(challenge, "plain")
    assert core.redirect_matches(["http://127.0.0.1/cb"], "http://127.0.0.1:5555/cb")
    assert core.redirect_matches(["http://localhost:1/cb"], "http://localhost:2/cb")
    assert not core.redirect_matches(["http://127.0.0.1/cb"], "http://127.0.0.1:5555/other")
    assert not core.redirect_matches(["https://a.example/cb"], "https://a.example:444/cb")
    assert core.with_query("http://x/cb?a=1", {"code": "c d"}) == "http://x/cb?a=1&code=c+d"
    assert core.token_name_part("Claude Code (1.0)") == "claude-code-1-0"
    assert core.token_name_part("日本") == "app"
    assert core.challenge("u", ["execute", "read"], "insufficient_scope", 'needs "x"') == (
        'Bearer error="insufficient_scope", error_description="needs \'x\'", resource_metadata="u", '
        'scope="read execute"'
    )
    assert core.same_resource("http://h:1/api/agent/mcp", "http://h:1/api/agent/mcp")
    assert core.same_resource("http://h:1/", "http://h:1/api/agent/mcp")
    assert not core.same_resource("http://h:2/api/agent/mcp", "http://h:1/api/agent/mcp")
    assert not core.same_resource("http://h:1/api/agent/mcpx", "http://h:1/api/agent/mcp")
    consent = core.parse_consent(["read"], ["edit"], "reports/**\n\n", "1 day", 30 * 86400)
    assert consent.paths == ("reports/**",) and consent.lifetime == 86400
    for bad in (([], [], "", "1 day"), (["root"], [], "", "1 day"), (["read"], [], "../x", "1 day"),
                (["read"], [], "", "30 days")):  # fmt: skip
        with pytest.raises(ValueError):
            core.parse_consent(*bad, 7 * 86400)


@pytest.mark.quick
def test_client_metadata_documents_are_checked_and_never_read_from_private_addresses(tmp_path: Path) -> None:
    from jupyter_agent_tools.auth import AgentIdentityProvider
    from jupyter_agent_tools.oauth.service import AgentOAuth

    good = {"client_id": CIMD_URL, "client_name": "A", "redirect_uris": [REDIRECT]}
    assert core.client_from_document(CIMD_URL, good, 0).verified_host == "agent.example"
    for bad in (
        {**good, "client_id": "https://agent.example/other.json"},
        {**good, "token_endpoint_auth_method": "private_key_jwt"},
        {**good, "redirect_uris": ["http://agent.example/cb"]},
        ["not", "an", "object"],
    ):
        with pytest.raises(core.OAuthError) as e:
            core.client_from_document(CIMD_URL, bad, 0)
        assert e.value.error == "invalid_client"
    assert core.is_metadata_url(CIMD_URL)
    for url in (
        "http://agent.example/c.json",
        "https://agent.example/",
        "https://u@agent.example/c",
        "jac_x",
    ):
        assert not core.is_metadata_url(url), url

    provider = AgentIdentityProvider(token_db=str(tmp_path / "tokens.db"))
    service = AgentOAuth(provider=provider, data_dir=str(tmp_path))

    async def look_up(url: str) -> str:
        with pytest.raises(core.OAuthError) as e:
            await service.client(url)
        return e.value.description

    try:
        for url in ("https://127.0.0.1:9/c.json", "https://localhost:9/c.json", "https://[::1]/c.json",
                    "https://10.0.0.1/c.json", "https://169.254.169.254/latest/c.json"):  # fmt: skip
            assert "private, loopback or link-local" in asyncio.run(look_up(url)), url
    finally:
        service.close()
    with pytest.raises(Exception, match="names another client_id"):
        AgentOAuth(
            provider=provider,
            data_dir=str(tmp_path),
            client_metadata_documents={CIMD_URL: {**good, "client_id": "x"}},
        )


@pytest.mark.quick
def test_a_code_lives_sixty_seconds(tmp_path: Path) -> None:
    from jupyter_agent_tools.auth import AgentIdentityProvider
    from jupyter_agent_tools.oauth.service import AgentOAuth

    now = [1_000_000.0]
    provider = AgentIdentityProvider(token_db=str(tmp_path / "tokens.db"))
    service = AgentOAuth(provider=provider, data_dir=str(tmp_path), clock=lambda: now[0])
    resource = "http://h/api/agent/mcp"

    async def flow() -> None:
        client = await service.register({"client_name": "c", "redirect_uris": [REDIRECT]})
        verifier, challenge = pkce()
        params = {
            "client_id": client["client_id"],
            "response_type": "code",
            "redirect_uri": REDIRECT,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
        request = await service.authorization_request(params, resource)
        consent = core.Consent(frozenset({"read"}), (), frozenset(), 3600)
        location = service.decide(request.id, consent, "me", "http://h")
        code = parse_qs(urlsplit(location).query)["code"][0]
        now[0] += 61
        form = {"grant_type": "authorization_code", "code": code, "code_verifier": verifier}
        with pytest.raises(core.OAuthError) as e:
            await service.token(
                {**form, "client_id": client["client_id"], "redirect_uri": REDIRECT}, resource
            )
        assert e.value.error == "invalid_grant" and "expired" in e.value.description
        with pytest.raises(Exception, match="expired or was already answered"):
            service.decide(request.id, consent, "me", "http://h")  # the consent page was answered once

    try:
        asyncio.run(flow())
        assert (tmp_path / "jupyter_agent_tools" / "oauth.db").stat().st_mode & 0o777 == 0o600
    finally:
        service.close()


def test_a_logged_in_browser_answers_the_consent_form_with_its_xsrf_token(server: Server) -> None:
    """The person's browser: the login page with the server's token, back to the consent page (the login
    redirect keeps the whole authorize URL); the form's POST needs the page's XSRF field."""
    with httpx.Client(base_url=server.url.rstrip("/")) as browser:
        flow = Flow(server, browser)
        verifier, challenge = pkce()
        url = flow.authorize_url(challenge)
        to_login = browser.get(url, follow_redirects=False)
        login_path = to_login.headers["Location"]
        assert to_login.status_code == 302 and login_path.startswith("/login?next=")
        browser.get(login_path)  # sets the _xsrf cookie
        xsrf = browser.cookies["_xsrf"]
        back = browser.post(
            login_path, data={"password": server.token, "_xsrf": xsrf}, follow_redirects=False
        )
        assert back.status_code == 302 and back.headers["Location"] == url.removeprefix(flow.origin)
        page = browser.get(back.headers["Location"])
        assert page.status_code == 200 and 'name="_xsrf"' in page.text
        form = {"request": consent_request_id(page.text), **approve("read")}
        forged = browser.post(url, data=form, follow_redirects=False)  # another site's form has no _xsrf
        assert forged.status_code == 403
        page = browser.get(url)  # (the refused POST answered nothing: a new page, a new request id)
        form = {"request": consent_request_id(page.text), "_xsrf": xsrf, **approve("read")}
        answered = browser.post(url, data=form, follow_redirects=False)
        assert answered.status_code == 302, answered.text
        code = parse_qs(urlsplit(answered.headers["Location"]).query)["code"][0]
        assert flow.exchange(code, verifier).status_code == 200


BROWSER = """
import os, re, sys, httpx
url = sys.argv[1]
auth = {"Authorization": "token " + os.environ["CONSENTING_TOKEN"]}
with httpx.Client() as c:
    page = c.get(url, headers=auth)
    rid = re.search(r'name="request" value="([^"]+)"', page.text).group(1)
    form = {"request": rid, "decision": "approve", "scope": ["read"], "lifetime": "1 day"}
    httpx.get(c.post(url, data=form, headers=auth).headers["Location"])
"""


def test_the_python_example_of_the_guide_signs_in_as_written(server: Server, tmp_path: Path) -> None:
    """docs/mcp.md's OAuth example, with this server's URL and a free callback port; the "browser" it opens
    (Python's webbrowser runs $BROWSER) answers the consent page as the logged-in person."""
    import os
    import subprocess
    import sys

    from jupyter_agent_tools.testing.server import free_port

    guide = (Path(__file__).resolve().parent.parent / "docs" / "mcp.md").read_text()
    found = re.search(r"\*\*The MCP Python SDK's OAuth client\*\*.*?```python\n(.*?)```", guide, re.S)
    assert found is not None
    code = found.group(1).replace("http://127.0.0.1:8888/", server.url).replace("33418", str(free_port()))
    (tmp_path / "browser.py").write_text(BROWSER)
    env = dict(
        os.environ, CONSENTING_TOKEN=server.token, BROWSER=f"{sys.executable} {tmp_path / 'browser.py'} %s &"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "is_error=False" in done.stdout and "'entries'" in done.stdout, done.stdout


@pytest.mark.quick
def test_sign_in_is_off_without_agent_tokens_behind_a_hub_or_when_disabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jupyter_server.auth.identity import PasswordIdentityProvider
    from traitlets import TraitError

    from jupyter_agent_tools.auth import AgentIdentityProvider
    from jupyter_agent_tools.oauth.service import AgentOAuth

    provider = AgentIdentityProvider(token_db=str(tmp_path / "tokens.db"))
    on = AgentOAuth(provider=provider, data_dir=str(tmp_path))
    assert on.active
    on.close()
    assert not AgentOAuth(provider=PasswordIdentityProvider(), data_dir=str(tmp_path)).active
    assert not AgentOAuth(provider=provider, data_dir=str(tmp_path), enabled=False).active
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "x")
    assert not AgentOAuth(provider=provider, data_dir=str(tmp_path)).active
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN")
    for bad in ({"access_token_lifetime": 30}, {"max_grant_lifetime": 60}, {"max_clients": 0},
                {"client_metadata_timeout": 0}):  # fmt: skip
        with pytest.raises(TraitError, match="AgentOAuth"):
            AgentOAuth(provider=provider, data_dir=str(tmp_path), **bad)
    # a grants file that cannot be used: logged; sign-in answers 503, nothing else breaks
    (tmp_path / "broken").mkdir()
    broken = AgentOAuth(provider=provider, data_dir=str(tmp_path), grants_db=str(tmp_path / "broken"))
    assert broken.active
    with pytest.raises(core.OAuthError) as e:
        asyncio.run(broken.register({"redirect_uris": [REDIRECT]}))
    assert e.value.error == "temporarily_unavailable" and e.value.status == 503
    broken.close()
