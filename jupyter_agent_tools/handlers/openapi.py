"""``/api/agent/openapi.json``: the OpenAPI 3.1 document of the agent routes."""

from __future__ import annotations

from tornado import web

from ..openapi import openapi_document
from .base import AgentAPIHandler


class OpenAPIHandler(AgentAPIHandler):
    """GET returns the document (any authenticated user may read the contract)."""

    @web.authenticated
    async def get(self) -> None:
        self.write_json(openapi_document(self.base_url))
