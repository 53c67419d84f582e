"""The base of every agent route: JSON bodies, service errors mapped to JSON HTTP errors."""

from __future__ import annotations

import asyncio
import functools
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from ..body import decode_json_body
from ..errors import AgentToolsError

# Parsing JSON costs about 1 ms per 10-30 KB (more with many small values): bodies larger than this are
# parsed in a thread, so that a 10 MB one does not hold the event loop for seconds. One thread: parsing
# holds the GIL, so more threads would not parse faster, only take more turns from the event loop.
PARSE_IN_THREAD_BYTES = 64 * 1024
_PARSER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-tools-json")


class AgentAPIHandler(ExtensionHandlerMixin, APIHandler):
    """JSON API handler of the jupyter_agent_tools extension."""

    @property
    def max_body_bytes(self) -> int:
        return int(getattr(self.extensionapp, "max_body_bytes", 0) or 0)

    async def json_body(self) -> Any:
        """The request body parsed as JSON, or a 4xx that says what is wrong with it (see
        :func:`decode_json_body`). A large body is parsed in a thread, so the server keeps answering
        everyone else meanwhile."""
        body, limit = self.request.body, self.max_body_bytes
        if len(body) <= PARSE_IN_THREAD_BYTES or (limit and len(body) > limit):
            return decode_json_body(body, limit)
        parse = functools.partial(decode_json_body, body, limit, stepwise=True)
        return await asyncio.get_running_loop().run_in_executor(_PARSER, parse)

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, ensure_ascii=False))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        if exc_info and isinstance(exc_info[1], ServiceHTTPError) and exc_info[1].retry_after:
            # Tornado clears headers before write_error, so Retry-After must be set here.
            self.set_header("Retry-After", str(exc_info[1].retry_after))
        super().write_error(status_code, **kwargs)

    def _handle_request_exception(self, e: BaseException) -> None:
        if isinstance(e, AgentToolsError):
            # Tornado reads sys.exc_info() here: re-raise as the HTTP error the caller should see.
            try:
                raise ServiceHTTPError.from_error(e) from e
            except ServiceHTTPError as http_error:
                super()._handle_request_exception(http_error)
            return
        super()._handle_request_exception(e)


class ServiceHTTPError(web.HTTPError):
    """An :class:`AgentToolsError` as a Tornado HTTP error (keeps Retry-After)."""

    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(status, message)
        self.retry_after = retry_after

    @classmethod
    def from_error(cls, error: AgentToolsError) -> ServiceHTTPError:
        return cls(error.status, error.message, error.retry_after)
