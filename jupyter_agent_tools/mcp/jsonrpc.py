"""JSON-RPC 2.0 as MCP uses it: error codes, message shapes, and the envelope check every message gets.

Pure: no I/O, no Tornado. MCP narrows JSON-RPC: an id is a string or an integer (never null), and
``params`` is an object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002  # MCP: resources/read of a URI the server does not have
HEADER_MISMATCH = -32020  # protocol 2026-07-28
UNSUPPORTED_PROTOCOL_VERSION = -32022  # protocol 2026-07-28

RequestId = str | int
Kind = Literal["request", "notification", "response"]


class RpcError(Exception):
    """A JSON-RPC error to answer with; ``status`` is the HTTP status when it is the whole answer."""

    def __init__(
        self, code: int, message: str, *, status: int = 400, data: Any = None, id: RequestId | None = None
    ):
        super().__init__(message)
        self.code, self.message, self.status, self.data, self.id = code, message, status, data, id

    def to_message(self) -> dict[str, Any]:
        return error_message(self.id, self.code, self.message, self.data)


@dataclass(frozen=True)
class Message:
    """One JSON-RPC message whose envelope is valid."""

    kind: Kind
    method: str  # "" for a response
    id: RequestId | None
    params: dict[str, Any]


def is_request_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def parse_message(value: Any) -> Message:
    """Check a decoded JSON value is one JSON-RPC message; raise :class:`RpcError` (-32600, -32602)."""
    if not isinstance(value, dict):
        raise RpcError(INVALID_REQUEST, "Invalid Request: a JSON-RPC message must be a JSON object")
    raw_id = value.get("id")
    has_id = "id" in value
    rid = raw_id if has_id and is_request_id(raw_id) else None
    if value.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, "Invalid Request: 'jsonrpc' must be \"2.0\"", id=rid)
    if has_id and rid is None:
        raise RpcError(
            INVALID_REQUEST, "Invalid Request: 'id' must be a string or an integer (MCP ids are never null)"
        )
    if "method" not in value:
        if has_id and ("result" in value or "error" in value):
            return Message("response", "", rid, {})
        raise RpcError(INVALID_REQUEST, "Invalid Request: 'method' is required", id=rid)
    method = value["method"]
    if not isinstance(method, str) or not method:
        raise RpcError(INVALID_REQUEST, "Invalid Request: 'method' must be a non-empty string", id=rid)
    params = value.get("params", {})
    if params is None and "params" in value:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "Invalid params: 'params' must be an object", id=rid)
    return Message("request" if has_id else "notification", method, rid, params)


def error_message(id: RequestId | None, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": id, "error": error}


def result_message(id: RequestId | None, result: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "result": result}


def notification(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}
