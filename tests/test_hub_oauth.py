"""OAuth sign-in on JupyterHub (issue 45 B), the quick tier: the signed token format, the service in-process
(a real SQLite grants file and signing key in a temporary state directory, an injected clock), and the
single-user server's check of a token minted from a test key. The flow through a real hub, its proxy and
the official MCP SDK is tests/test_jupyterhub.py's ``test_an_mcp_client_signs_in_at_the_hub_...``."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import secrets
import sqlite3
import stat
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from jupyter_agent_tools.auth.hub_tokens import HubAgentTokens
from jupyter_agent_tools.hub_oauth.service import HubOAuthService, server_of
from jupyter_agent_tools.oauth import jwt
from jupyter_agent_tools.oauth.core import Consent, OAuthError
from jupyter_agent_tools.oauth.grants import GrantStore

pytestmark = pytest.mark.quick

HUB = "https://hub.example.org"
ALICE = HUB + "/user/alice/api/agent/mcp"
REDIRECT = "http://127.0.0.1:4321/callback"


def claims(**changes: Any) -> dict[str, Any]:
    base = {
        "iss": HUB,
        "aud": ALICE,
        "sub": "alice",
        "client_id": "jac_x",
        "client_name": "Claude Code",
        "scope": "read execute",
        "paths": ["reports/**"],
        "ask": ["execute"],
        "grant": "7",
        "jti": "j",
        "iat": 1000,
        "exp": 4600,
    }
    return {**base, **changes}


def test_a_signed_token_checks_only_with_its_key_untampered() -> None:
    key = jwt.load_private_key(jwt.new_private_key_pem())
    jwk = jwt.public_jwk(key)
    keys = jwt.public_keys({"keys": [jwk]})
    token = jwt.sign(claims(), key, jwk["kid"])
    assert jwt.looks_like_jwt(token) and not jwt.looks_like_jwt("jat_" + "x" * 43)
    assert jwt.verify(token, keys) == claims()
    head, body, signature = token.split(".")
    other = jwt.b64encode(json.dumps(claims(aud=HUB + "/user/bob/api/agent/mcp")).encode())
    with pytest.raises(jwt.TokenInvalid, match="signature"):
        jwt.verify(f"{head}.{other}.{signature}", keys)  # alice's token made out for bob
    with pytest.raises(jwt.UnknownKey):
        jwt.verify(jwt.sign(claims(), jwt.load_private_key(jwt.new_private_key_pem()), "k2"), keys)
    stranger = jwt.load_private_key(jwt.new_private_key_pem())
    with pytest.raises(jwt.TokenInvalid, match="signature"):
        jwt.verify(jwt.sign(claims(), stranger, jwk["kid"]), keys)  # another key under this kid
    none = jwt.b64encode(json.dumps({"alg": "none", "typ": "at+jwt", "kid": jwk["kid"]}).encode())
    with pytest.raises(jwt.TokenInvalid, match="EdDSA"):
        jwt.verify(f"{none}.{body}.{signature}", keys)
    # the claims: issuer, audience, expiry (30 s of leeway), the agent's claims' shapes
    jwt.check_claims(claims(), HUB, ALICE, 2000)
    with pytest.raises(jwt.TokenInvalid, match="not for this server"):
        jwt.check_claims(claims(), HUB, HUB + "/user/bob/api/agent/mcp", 2000)
    with pytest.raises(jwt.TokenInvalid, match="issued by"):
        jwt.check_claims(claims(iss="https://evil.example"), HUB, ALICE, 2000)
    with pytest.raises(jwt.Expired):
        jwt.check_claims(claims(), HUB, ALICE, 4631)
    with pytest.raises(jwt.TokenInvalid, match="paths"):
        jwt.check_claims(claims(paths="reports/**"), HUB, ALICE, 2000)


def test_the_server_of_a_resource_is_one_users_server_on_this_hub() -> None:
    assert server_of(ALICE, HUB, "/") == ("alice", "")
    assert server_of(HUB + "/user/alice/lab2/api/agent/mcp", HUB, "/") == ("alice", "lab2")
    assert server_of("https://hub.example.org/jh/user/a%40b/api/agent/mcp", HUB, "/jh/") == ("a@b", "")
    for bad in (
        "https://evil.example/user/alice/api/agent/mcp",
        HUB + "/user/alice/api/agent/mcp?x=1",
        HUB + "/hub/api/agent/mcp",
        HUB + "/user//api/agent/mcp",
        HUB + "/user/alice/a/b/api/agent/mcp",
        "not a url",
    ):
        with pytest.raises(OAuthError) as refused:
            server_of(bad, HUB, "/")
        assert refused.value.error == "invalid_target"


def test_a_version_1_grants_file_gains_the_resource_column(tmp_path: Path) -> None:
    path = tmp_path / "oauth.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE grants (id INTEGER PRIMARY KEY AUTOINCREMENT, client_id TEXT NOT NULL, "
        "client_name TEXT NOT NULL, user TEXT NOT NULL, token_name TEXT NOT NULL, scopes TEXT NOT NULL, "
        "paths TEXT NOT NULL, "
        "ask TEXT NOT NULL, created REAL NOT NULL, expires REAL NOT NULL, access_hash TEXT, last_refresh "
        "REAL, revoked REAL, revoked_why TEXT); INSERT INTO grants (client_id, client_name, user, "
        "token_name, scopes, paths, ask, created, expires) VALUES ('c', 'App', 'me', 'oauth-app-1', 'read', "
        "'[]', '', 1, 2); PRAGMA user_version=1;"
    )
    db.close()
    store = GrantStore(str(path))
    (grant,) = store.grants()
    assert grant.resource == "" and grant.token_name == "oauth-app-1"
    store.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


def test_the_service_issues_refreshes_and_revokes_tokens_for_one_server(tmp_path: Path) -> None:
    """register -> alice's request for her server -> consent -> code + PKCE -> a signed token whose
    audience is her server; bob cannot ask for hers; the refresh token rotates, a reused one revokes the
    grant, which the revocation list then names; the key is private to the service's state directory."""
    clock = Clock()
    service = HubOAuthService(state_dir=str(tmp_path / "state"), public_url=HUB, clock=clock)
    key_file = tmp_path / "state" / "signing_key.pem"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "state").st_mode) == 0o700
    verifier, challenge = pkce()

    async def flow() -> dict[str, Any]:
        client = await service.register({"client_name": "Claude Code", "redirect_uris": [REDIRECT]})
        params = {
            "client_id": client["client_id"],
            "redirect_uri": "http://127.0.0.1:5555/callback",  # another loopback port (RFC 8252)
            "response_type": "code",
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "state": "s",
            "resource": ALICE,
            "scope": "read",
        }
        with pytest.raises(OAuthError) as bobs:
            await service.request_for(params, "bob", HUB)
        assert bobs.value.error == "access_denied" and bobs.value.status == 403
        with pytest.raises(OAuthError) as unnamed:
            await service.request_for({**params, "resource": ""}, "alice", HUB)
        assert (
            unnamed.value.error == "invalid_target"
            and "/user/alice/api/agent/mcp" in unnamed.value.description
        )
        request, target = await service.request_for(params, "alice", HUB)
        assert target == "alice's server"
        consent = Consent(frozenset({"read"}), ("reports/**",), frozenset({"edit"}), 86400.0)
        location = service.decide(request.id, consent, "alice", HUB)
        query = parse_qs(urlsplit(location).query)
        assert query["iss"] == [HUB] and query["state"] == ["s"]
        form = {
            "grant_type": "authorization_code",
            "code": query["code"][0],
            "client_id": client["client_id"],
            "redirect_uri": "http://127.0.0.1:5555/callback",
            "code_verifier": verifier,
        }
        issued = await service.token(form, "")
        assert issued["scope"] == "read" and issued["expires_in"] == 3600
        with pytest.raises(OAuthError) as replayed:
            await service.token(form, "")
        assert replayed.value.error == "invalid_grant"
        return issued

    issued = asyncio.run(flow())
    access = issued["access_token"]
    keys = jwt.public_keys(service.jwks())
    got = jwt.verify(access, keys)
    jwt.check_claims(got, HUB, ALICE, clock.now)
    assert (got["sub"], got["scope"], got["paths"], got["ask"]) == ("alice", "read", ["reports/**"], ["edit"])
    assert got["client_name"] == "Claude Code" and got["exp"] - got["iat"] == 3600
    # the code's replay revoked the grant (RFC 6749 4.1.2): its refresh token is dead, the list names it
    refresh = {"grant_type": "refresh_token", "refresh_token": issued["refresh_token"]}

    async def after_replay() -> list[str]:
        with pytest.raises(OAuthError) as dead:
            await service.token(refresh, "")
        assert dead.value.error == "invalid_grant"
        return await service.revoked()

    assert asyncio.run(after_replay()) == [got["grant"]]
    service.close()


def test_refresh_rotates_and_its_reuse_revokes_the_grant(tmp_path: Path) -> None:
    clock = Clock()
    service = HubOAuthService(state_dir=str(tmp_path), public_url=HUB, clock=clock)
    verifier, challenge = pkce()

    async def run() -> None:
        client = await service.register({"client_name": "Codex", "redirect_uris": [REDIRECT]})
        params = {
            "client_id": client["client_id"],
            "redirect_uri": REDIRECT,
            "response_type": "code",
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "resource": HUB + "/user/alice/lab2/api/agent/mcp",
        }
        request, target = await service.request_for(params, "alice", HUB)
        assert target == "alice's server 'lab2'"
        location = service.decide(
            request.id, Consent(frozenset({"read"}), (), frozenset(), 3600.0), "alice", HUB
        )
        code = parse_qs(urlsplit(location).query)["code"][0]
        first = await service.token(
            {"grant_type": "authorization_code", "code": code, "client_id": client["client_id"],
             "redirect_uri": REDIRECT, "code_verifier": verifier}, "",
        )  # fmt: skip
        refresh = {"grant_type": "refresh_token", "refresh_token": first["refresh_token"]}
        with pytest.raises(OAuthError) as elsewhere:  # the resource stays the one consented to
            await service.token({**refresh, "resource": ALICE}, "")
        assert elsewhere.value.error == "invalid_target"
        clock.now += 600
        second = await service.token(refresh, "")
        assert second["refresh_token"] != first["refresh_token"]
        claims2 = jwt.verify(second["access_token"], jwt.public_keys(service.jwks()))
        assert claims2["aud"] == HUB + "/user/alice/lab2/api/agent/mcp"
        assert claims2["exp"] == int(clock.now) + 3000  # not past the grant's hour
        assert await service.revoked() == []
        with pytest.raises(OAuthError) as reused:
            await service.token(refresh, "")
        assert reused.value.error == "invalid_grant" and "already used" in reused.value.description
        with pytest.raises(OAuthError):
            await service.token({**refresh, "refresh_token": second["refresh_token"]}, "")
        assert await service.revoked() == [claims2["grant"]]
        # RFC 7009: a revocation of an unknown token says nothing; the grants list shows the end
        await service.revoke({"token": "nope"})
        (grant,) = await service.grants_of("alice")
        assert grant["status"] == "revoked" and grant["server"].endswith("/lab2/api/agent/mcp")
        assert await service.grants_of("bob") == []

    asyncio.run(run())
    service.close()


def test_a_server_checks_a_token_minted_from_a_pinned_test_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """HubAgentTokens with the public key pinned: a token for this server becomes an agent token record
    (name, scopes, paths, ask, expiry, signed_by); another server's, another user's, another issuer's or a
    revoked grant's is refused."""
    key = jwt.load_private_key(jwt.new_private_key_pem())
    jwk = jwt.public_jwk(key)
    clock = Clock()
    clock.now = 2000.0
    checker = HubAgentTokens(issuer=HUB + "/", jwks={"keys": [jwk]}, clock=clock)
    assert checker.issuer == HUB and checker.base == HUB + "/services/agent-oauth/"
    checker._revoked, checker._revoked_read = frozenset({"9"}), clock.now  # as read from the service
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    token = jwt.sign(claims(), key, jwk["kid"])

    async def check(token: str, audience: str = ALICE) -> Any:
        return await checker.check(token, audience)

    record = asyncio.run(check(token))
    assert record.name == "oauth-claude-code-7" and record.signed_by == HUB
    assert record.scopes == {"read", "execute"} and record.paths == ("reports/**",)
    assert record.ask == {"execute"} and record.expires == 4600 and record.status(clock.now) == "active"
    assert checker.client_of(record.id) == "jac_x" and checker.status(record) == "active"
    for bad, why in [
        (jwt.sign(claims(aud=HUB + "/user/bob/api/agent/mcp"), key, jwk["kid"]), "not for this server"),
        (jwt.sign(claims(sub="bob"), key, jwk["kid"]), "issued to 'bob'"),
        (jwt.sign(claims(iss="https://other.example"), key, jwk["kid"]), "issued by"),
        (jwt.sign(claims(grant="9"), key, jwk["kid"]), "revoked"),
        (jwt.sign(claims(scope="admin"), key, jwk["kid"]), "no scope"),
        (jwt.sign(claims(paths=["../etc/**"]), key, jwk["kid"]), "paths"),
    ]:
        with pytest.raises(jwt.TokenInvalid, match=why):
            asyncio.run(check(bad))
    # a grant revoked after the token was seen: the next check of watched tokens ends it
    checker._revoked = frozenset({"7"})
    assert checker.status(record) == "revoked"


async def sign_in(service: HubOAuthService, resource: str = ALICE) -> dict[str, Any]:
    """An app registered, alice's consent (read) for ``resource``, the code traded: the token answer."""
    verifier, challenge = pkce()
    client = await service.register({"client_name": "Cursor", "redirect_uris": [REDIRECT]})
    params = {
        "client_id": client["client_id"],
        "redirect_uri": REDIRECT,
        "response_type": "code",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "resource": resource,
    }
    request, _ = await service.request_for(params, "alice", HUB)
    consent = Consent(frozenset({"read"}), (), frozenset(), 86400.0)
    code = parse_qs(urlsplit(service.decide(request.id, consent, "alice", HUB)).query)["code"][0]
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": REDIRECT,
        "code_verifier": verifier,
    }
    return await service.token({**form, "client_id": client["client_id"]}, "")


def test_an_app_revokes_its_grant_with_its_access_token_and_the_person_with_the_apps_page(
    tmp_path: Path,
) -> None:
    """RFC 7009 with the signed access token itself ends the grant (the servers' list names it); alice
    disconnects another app herself; bob cannot disconnect hers."""
    service = HubOAuthService(state_dir=str(tmp_path), public_url=HUB, clock=Clock())

    async def run() -> None:
        first = await sign_in(service)
        grant = jwt.verify(first["access_token"], jwt.public_keys(service.jwks()))["grant"]
        await service.revoke({"token": first["access_token"]})
        assert await service.revoked() == [grant]
        with pytest.raises(OAuthError):
            await service.token({"grant_type": "refresh_token", "refresh_token": first["refresh_token"]}, "")
        second = await sign_in(service, HUB + "/user/alice/lab2/api/agent/mcp")
        other = jwt.verify(second["access_token"], jwt.public_keys(service.jwks()))["grant"]
        with pytest.raises(OAuthError) as not_bobs:
            await service.revoke_own("bob", int(other))
        assert not_bobs.value.status == 404
        await service.revoke_own("alice", int(other))
        assert await service.revoked() == [grant, other]
        listed = await service.grants_of("alice")
        assert [(g["status"], g["revoked_why"]) for g in listed] == [
            ("revoked", "revoked by the person"),
            ("revoked", "revoked by the app"),
        ]

    asyncio.run(run())
    service.close()
