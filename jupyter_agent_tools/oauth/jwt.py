"""Signed access tokens (JWS compact, EdDSA with Ed25519; RFC 7515, RFC 8037, RFC 9068), the pure part.

The JupyterHub service (:mod:`jupyter_agent_tools.hub_oauth`) signs an access token for ONE user's server
with its private key; each single-user server verifies it with the public key only
(:mod:`jupyter_agent_tools.auth.hub_tokens`): a user's server, holding no secret that could sign, cannot
mint a token for another's. Needs the ``cryptography`` package (the ``hub`` extra).

Claims (``typ: at+jwt``): ``iss`` (the hub's public origin), ``aud`` (the server's MCP URL), ``sub`` (the
hub user), ``client_id``, ``client_name``, ``scope`` (space separated), ``paths`` (globs), ``ask``
(actions), ``grant`` (the grant's id, what a revocation names), ``jti``, ``iat``, ``exp``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

ALGORITHM = "EdDSA"
TOKEN_TYPE = "at+jwt"
MAX_TOKEN_LENGTH = 8192
LEEWAY = 30.0  # seconds of clock difference between the hub and a server
_JWT = re.compile(r"^eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
CRYPTOGRAPHY_MISSING = (
    "signed hub tokens need the cryptography package: pip install 'jupyter-agent-tools[hub]'"
)


class TokenInvalid(Exception):
    """A signed token that is not accepted: the message says why (never the token)."""


def b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def looks_like_jwt(token: str) -> bool:
    """Whether ``token`` has the shape of a compact JWS (three base64url parts, a JSON header)."""
    return len(token) <= MAX_TOKEN_LENGTH and bool(_JWT.match(token))


# -- keys ------------------------------------------------------------------------------------------------


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - the hub extra installs it
        raise TokenInvalid(CRYPTOGRAPHY_MISSING) from None
    return ed25519


def new_private_key_pem() -> bytes:
    """A new Ed25519 private key, PKCS#8 PEM."""
    from cryptography.hazmat.primitives import serialization

    key = _ed25519().Ed25519PrivateKey.generate()
    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def load_private_key(pem: bytes) -> Any:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, _ed25519().Ed25519PrivateKey):
        raise ValueError("the signing key is not an Ed25519 key")
    return key


def public_jwk(private_key: Any) -> dict[str, str]:
    """The public JWK (RFC 8037) of a private key, its ``kid`` the RFC 7638 thumbprint."""
    from cryptography.hazmat.primitives import serialization

    raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x = b64encode(raw)
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"), sort_keys=True)
    kid = b64encode(hashlib.sha256(canonical.encode()).digest())
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": ALGORITHM, "use": "sig"}


def public_keys(jwks: Any) -> dict[str, Any]:
    """The Ed25519 public keys of a JWKS document (``{"keys": [...]}``), by ``kid``; others are skipped."""
    if not isinstance(jwks, Mapping) or not isinstance(jwks.get("keys"), list):
        raise ValueError('a JWKS document is a JSON object {"keys": [...]}')
    ed25519 = _ed25519()
    keys = {}
    for jwk in jwks["keys"]:
        if not isinstance(jwk, Mapping) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            continue
        kid, x = jwk.get("kid"), jwk.get("x")
        if not isinstance(kid, str) or not isinstance(x, str):
            continue
        try:
            keys[kid] = ed25519.Ed25519PublicKey.from_public_bytes(b64decode(x))
        except ValueError:
            continue
    return keys


# -- signing and verifying -------------------------------------------------------------------------------


def sign(claims: Mapping[str, Any], private_key: Any, kid: str) -> str:
    header = {"alg": ALGORITHM, "typ": TOKEN_TYPE, "kid": kid}
    head = b64encode(json.dumps(header, separators=(",", ":")).encode())
    body = b64encode(json.dumps(dict(claims), separators=(",", ":")).encode())
    signature = private_key.sign(f"{head}.{body}".encode("ascii"))
    return f"{head}.{body}.{b64encode(signature)}"


def verify(token: str, keys: Mapping[str, Any]) -> dict[str, Any]:
    """The claims of ``token`` once its signature checks with the key its header names (no claim is
    checked here: :func:`check_claims`). A ``kid`` not in ``keys`` raises :class:`UnknownKey`."""
    if not looks_like_jwt(token):
        raise TokenInvalid("the token is not a signed token")
    head, body, signature = token.split(".")
    try:
        header = json.loads(b64decode(head))
        raw_signature = b64decode(signature)
    except ValueError:
        raise TokenInvalid("the token's header is not JSON") from None
    if not isinstance(header, dict) or header.get("alg") != ALGORITHM or header.get("typ") != TOKEN_TYPE:
        raise TokenInvalid(f"the token is not an {ALGORITHM} access token ({TOKEN_TYPE})")
    kid = header.get("kid")
    key = keys.get(kid) if isinstance(kid, str) else None
    if key is None:
        raise UnknownKey(f"the token is signed with a key this server does not know ({kid!r})")
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(raw_signature, f"{head}.{body}".encode("ascii"))
    except InvalidSignature:
        raise TokenInvalid("the token's signature does not check") from None
    try:
        claims = json.loads(b64decode(body))
    except ValueError:
        raise TokenInvalid("the token's claims are not JSON") from None
    if not isinstance(claims, dict):
        raise TokenInvalid("the token's claims are not a JSON object")
    return claims


class UnknownKey(TokenInvalid):
    """The token names a key id the verifier has not seen (fetch the keys again, then decide)."""


def check_claims(claims: Mapping[str, Any], issuer: str, audience: str, now: float) -> None:
    """Check ``iss``, ``aud``, ``exp``, ``iat`` and the shapes of the agent claims; TokenInvalid says
    which one failed."""
    if claims.get("iss") != issuer:
        raise TokenInvalid(f"the token was issued by {claims.get('iss')!r}, not by {issuer!r}")
    if claims.get("aud") != audience:
        raise TokenInvalid(
            f"the token was issued for {claims.get('aud')!r}, not for this server ({audience}): sign in "
            "for this server"
        )
    exp, iat = claims.get("exp"), claims.get("iat")
    if not isinstance(exp, (int, float)) or not isinstance(iat, (int, float)):
        raise TokenInvalid("the token has no expiry")
    if now >= exp + LEEWAY:
        raise Expired("the token expired: the app renews it with its refresh token, or signs in again")
    if iat > now + LEEWAY:
        raise TokenInvalid("the token was issued in the future (are the clocks of the hub and server set?)")
    for name in ("sub", "client_id", "scope", "grant", "jti"):
        if not isinstance(claims.get(name), str) or not claims[name]:
            raise TokenInvalid(f"the token's {name!r} claim is missing")
    for name in ("paths", "ask"):
        value = claims.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise TokenInvalid(f"the token's {name!r} claim is not a list of strings")


class Expired(TokenInvalid):
    """The token's ``exp`` has passed."""
