"""``/api/agent/files``: find notebooks and files under a folder (``read`` on ``contents``)."""

from __future__ import annotations

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..files import list_files
from ..notebook.reading import query_int
from .base import AgentAPIHandler

TRUE_VALUES = ("1", "true", "yes", "on")


class FilesHandler(AgentAPIHandler):
    """GET lists files as the contents manager shows them (hidden files, an agent token's paths), without
    what the ignore files exclude unless ``ignored``."""

    route_name = "files"

    auth_resource = "contents"

    @web.authenticated
    @authorized
    async def get(self) -> None:
        arg = self.get_query_argument
        limit = query_int("limit", arg("limit", None))
        answer = await list_files(
            self.contents_manager,
            arg("path", "") or "",
            recursive=(arg("recursive", "") or "").lower() in TRUE_VALUES,
            limit=500 if limit is None else limit,
            glob=arg("glob", None),
            max_depth=query_int("max_depth", arg("max_depth", None)),
            start=arg("start", None),
            ignored=(arg("ignored", "") or "").lower() in TRUE_VALUES,
        )
        await self.write_json(answer)
