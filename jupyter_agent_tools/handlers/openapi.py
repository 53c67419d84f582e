"""``/api/agent/openapi.json``: the OpenAPI 3.1 document of the agent routes; a JSON 404 for any other
``/api/agent/...`` path."""

from __future__ import annotations

from typing import Any

from jupyter_server.utils import url_path_join
from tornado import web

from ..api_document import openapi_document
from .base import AgentAPIHandler

# A path echoed in the message is cut here (a URL may be as long as the server's header limit).
MAX_ECHOED_PATH = 200


class OpenAPIHandler(AgentAPIHandler):
    """GET returns the document (any authenticated user may read the contract)."""

    route_name = "openapi"

    @web.authenticated
    async def get(self) -> None:
        await self.write_json(openapi_document(self.base_url))


class UnknownRouteHandler(AgentAPIHandler):
    """Any method on a path under ``/api/agent`` that no route takes: a JSON 404, not the server's HTML
    page (authentication first, as on every route)."""

    route_name = "unknown"

    def _not_found(self, *args: Any) -> None:
        path = self.request.path
        if len(path) > MAX_ECHOED_PATH:
            path = path[: MAX_ECHOED_PATH - 3] + "..."
        contract = url_path_join(self.base_url, "api/agent/openapi.json")
        raise web.HTTPError(404, f"No such agent route: {self.request.method} {path} (see {contract})")

    get = post = put = patch = delete = head = web.authenticated(_not_found)
