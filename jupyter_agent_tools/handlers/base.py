"""The base of every agent route: JSON bodies, service errors mapped to JSON HTTP errors."""

from __future__ import annotations

import json
import re
from http.client import responses
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from ..errors import AgentToolsError


class AgentAPIHandler(ExtensionHandlerMixin, APIHandler):
    """JSON API handler of the jupyter_agent_tools extension."""

    @property
    def max_body_bytes(self) -> int:
        return int(getattr(self.extensionapp, "max_body_bytes", 0) or 0)

    def get_json_object(self) -> Any:
        """The request body parsed as JSON, or a 4xx that says what is wrong with it.

        Checked before parsing: the size (413 past ``max_body_bytes``), UTF-8. Refused while parsing:
        invalid JSON, nesting deeper than the parser's recursion limit, ``NaN``/``Infinity`` (not JSON),
        an object with the same key twice (which value was meant is ambiguous), and a string holding a
        lone UTF-16 surrogate escape (valid JSON, but not text that can be saved or sent on).
        """
        body = self.request.body
        limit = self.max_body_bytes
        if limit and len(body) > limit:
            raise web.HTTPError(
                413,
                f"Request body is too large: {len(body)} bytes (at most {limit}; the server's "
                "c.AgentToolsApp.max_body_bytes)",
            )
        if not body:
            raise web.HTTPError(400, "Request body is empty: send a JSON object")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise web.HTTPError(400, "Request body is not UTF-8 encoded JSON") from None
        try:
            value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
            if _SURROGATE_ESCAPE.search(text):
                # "\ud800" alone is valid JSON but not Unicode: it could be neither saved nor sent on.
                json.dumps(value, ensure_ascii=False).encode("utf-8")
        except RecursionError:
            raise web.HTTPError(400, "Request body is nested too deeply") from None
        except UnicodeEncodeError:
            raise web.HTTPError(
                400, "Request body is not valid JSON: a \\u escape is a lone UTF-16 surrogate (not Unicode)"
            ) from None
        except ValueError as e:
            raise web.HTTPError(400, f"Request body is not valid JSON: {e}") from None
        return value

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, ensure_ascii=False))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """JSON errors; a service's :class:`AgentToolsError` answers its own status and message.

        Tornado sends any exception that is not an ``HTTPError`` here as a 500; the status is corrected
        before anything is written (public API only: ``set_status``/``write_error``).
        """
        exc_info = kwargs.get("exc_info")
        error = exc_info[1] if exc_info else None
        if not isinstance(error, AgentToolsError):
            super().write_error(status_code, **kwargs)
            return
        self.clear()  # Tornado clears headers before write_error; start from a clean slate anyway
        self.set_status(error.status)
        self.set_header("Content-Type", "application/json")
        if error.retry_after:
            self.set_header("Retry-After", str(error.retry_after))
        reply = {"message": error.message, "reason": responses.get(error.status, "")}
        self.log.warning("wrote error: %r", error.message)
        self.finish(json.dumps(reply, ensure_ascii=False))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        """An expected service error is a caller's mistake or a busy server, not a server bug."""
        if isinstance(value, AgentToolsError):
            request = self.request
            self.log.warning("%d %s %s: %s", value.status, request.method, request.uri, value.message)
            return
        super().log_exception(typ, value, tb)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r} in an object")
            seen.add(key)
    return obj
