"""The ``requestState`` of a 2026-07-28 input-required answer: what a retried call claims to continue,
integrity-protected (no Tornado).

The client echoes the state verbatim when it retries the call, and the MCP specification has servers treat
that echo as attacker-controlled. The state is JSON claims (which approval, whose, for which tool and
arguments, until when) signed with HMAC-SHA256 under a key held only by this process: a state minted by
another process (or before a restart, when pending approvals expire anyway) is refused. It is signed, not
encrypted: the claims say nothing the caller does not know.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from typing import Any

MAX_STATE_CHARS = 2048  # a state this module mints is ~300 characters


class InvalidRequestState(Exception):
    """The echoed state is not one this process minted for this caller, call and arguments, or it expired."""


@dataclass(frozen=True)
class ApprovalState:
    """What a retried call continues: waiting for approval ``approval_id``."""

    approval_id: int
    owner: str  # the caller (HttpRequest.user: a token's hash or a logged-in user)
    tool: str
    arguments: str  # the call's arguments, hashed
    expires: float  # the approval request's expiry (epoch seconds)


def arguments_digest(arguments: dict[str, Any]) -> str:
    """The hash a state binds a call's arguments with (canonical JSON)."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:
        raise ValueError("non-canonical base64url")
    return raw


class RequestStates:
    """Mints and checks the states of one server process."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else os.urandom(32)

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, b"agent-tools/request-state/v1\0" + payload, hashlib.sha256).digest()

    def seal(self, state: ApprovalState) -> str:
        claims = {
            "approval": state.approval_id,
            "owner": state.owner,
            "tool": state.tool,
            "arguments": state.arguments,
            "expires": state.expires,
        }
        payload = json.dumps(claims, separators=(",", ":")).encode()
        return f"v1.{_b64(payload)}.{_b64(self._mac(payload))}"

    def unseal(self, token: Any, *, owner: str, tool: str, arguments: dict[str, Any]) -> ApprovalState:
        """The state ``token`` carries, checked against the retried call; raises InvalidRequestState."""
        if not isinstance(token, str) or len(token) > MAX_STATE_CHARS:
            raise InvalidRequestState("not a state this server issued")
        try:
            version, payload_text, mac_text = token.split(".")
            payload, mac = _unb64(payload_text), _unb64(mac_text)
        except (ValueError, binascii.Error):
            raise InvalidRequestState("not a state this server issued") from None
        if version != "v1" or not hmac.compare_digest(mac, self._mac(payload)):
            raise InvalidRequestState("not a state this server process issued (was the server restarted?)")
        claims = json.loads(payload)  # (signed by this process: well-formed)
        state = ApprovalState(
            claims["approval"], claims["owner"], claims["tool"], claims["arguments"], claims["expires"]
        )
        if not hmac.compare_digest(state.owner, owner):
            raise InvalidRequestState("issued to another caller")
        if state.tool != tool or state.arguments != arguments_digest(arguments):
            raise InvalidRequestState("issued for another call (the tool or its arguments differ)")
        if state.expires < time.time():
            raise InvalidRequestState(f"approval {state.approval_id} expired")
        return state
