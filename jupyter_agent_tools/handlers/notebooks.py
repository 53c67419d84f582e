"""``/api/agent/notebooks/{path}``: read a notebook for an agent, change it cell by cell."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Mapping
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized
from tornado import web

from ..approvals import Approval
from ..approvals.actions import (
    bind_edit,
    bind_run,
    describe_edit,
    describe_kernel_action,
    describe_run,
    run_also,
)
from ..approvals.gate import without_gate_fields
from ..errors import BadRequest
from ..execution.notebook_run import NotebookRunner
from ..execution.pace import StreamPace
from ..execution.request import parse_run_request
from ..notebook.reading import output_body, query_int, read_view, render_text
from ..notebook.store import NotebookStore
from ..schemas import is_create_request
from ..stream_events import Emit
from .base import AgentAPIHandler
from .eval import EvalHandler

TRUE_VALUES = ("1", "true", "yes", "on")
# The path of a notebook in a route that goes on after it (".../cells/..."): it must end in .ipynb.
NOTEBOOK_PATH_REGEX = r"(?P<path>(?:/[^/]+)*?/[^/]+\.ipynb)"


class NotebookHandler(AgentAPIHandler):
    """GET reads (``read`` on ``contents``); POST applies operations (``write`` on ``contents``)."""

    route_name = "notebook"

    auth_resource = "contents"

    @property
    def store(self) -> NotebookStore:
        return self.app.notebook_store

    @web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        arg = functools.partial(self.get_query_argument, default=None)
        view = read_view(
            start=query_int("start", arg("start")),
            limit=query_int("limit", arg("limit")),
            cell_ids=arg("cell_ids"),
            include=arg("include"),
            format=arg("format"),
            include_binary=(arg("include_binary") or "").lower() in TRUE_VALUES,
        )
        answer = await self.store.read(path, view=view, since=arg("since"))
        if not view.text:
            await self.write_json(answer)
            return
        self.finish(render_text(answer), set_content_type="text/plain; charset=utf-8")

    @web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        gate_body = await self.json_body()
        body = without_gate_fields(gate_body)
        creating = is_create_request(body)

        async def apply(body: Any) -> tuple[dict[str, Any], int]:
            if creating:
                return await self.store.create(path, body), 201
            return await self.store.edit(path, body), 200

        async def bind(approval: Approval, body: Any) -> Any:  # the notebook is still as the person saw it
            return await bind_edit(self.store, approval, path, body)

        describe = functools.partial(self._describe, path, body, creating)
        await self.respond_gated("edit", path, describe, gate_body, apply, bind)

    async def _describe(self, path: str, body: Any, creating: bool) -> tuple[str, dict[str, Any]]:
        """What the person is shown: the edit's diff on the notebook now."""
        return await describe_edit(self.store, path, body, creating)


class NotebookOutputHandler(AgentAPIHandler):
    """GET one output of a cell in full (``read`` on ``contents``), or one MIME type of it as its bytes.

    A type a browser could run (HTML, SVG, JavaScript...) is served as an attachment, sandboxed by the
    Content-Security-Policy and never sniffed: the server's origin must not run a notebook's content.
    """

    auth_resource = "contents"

    @property
    def store(self) -> NotebookStore:
        return self.app.notebook_store

    @property
    def content_security_policy(self) -> str:
        return super().content_security_policy + "; sandbox"

    @web.authenticated
    @authorized
    async def get(self, path: str, cell: str, n: str) -> None:
        index = query_int("output index", n)
        if index is None or index < 0:
            raise BadRequest(f"The output index must be an integer from 0, got {n[:40]!r}")
        output, answer = await self.store.read_output(path, cell, index)
        mime = self.get_query_argument("mime", None)
        if mime is None:
            await self.write_json(answer)
            return

        def describe() -> str:
            return f"Output {index} of cell {answer['cell_id'] or '@' + str(answer['cell_index'])}"

        body = output_body(output, mime, describe)
        self.set_header("X-Content-Type-Options", "nosniff")
        if not body.inline:
            self.set_header("Content-Disposition", f'attachment; filename="{body.filename}"')
        self.finish(body.data, set_content_type=body.content_type)


class NotebookRunHandler(EvalHandler):
    """POST runs the notebook's cells in its own kernel and writes their outputs back.

    Authorized as ``write`` on ``contents`` (the decorator) and ``execute`` on ``kernels`` (checked
    before anything runs); JSON or an NDJSON stream like eval, and closing the stream interrupts.
    """

    route_name = "notebook_run"

    auth_resource = "contents"
    _path = ""

    @property
    def runner(self) -> NotebookRunner:
        return self.app.notebook_runner

    run_kind = "notebook_run"

    def _call(
        self, body: Any, emit: Emit, cancel: asyncio.Event, pace: StreamPace | None = None
    ) -> Awaitable[Mapping[str, Any]]:
        return self.runner.run(self._path, body, emit=emit, cancel=cancel, pace=pace)

    async def _check(self, body: Any) -> str | None:
        parse_run_request(body)
        path, *_ = await self.runner.store.load(self._path, writable=True)  # 404 now, not a failed run
        return str(path)

    def _gate_path(self, body: Any) -> str | None:
        return self._path

    def _gate_also(self, body: Any) -> tuple[str, ...]:
        return run_also(body)

    async def _describe(self, body: Any) -> tuple[str, dict[str, Any]]:
        """What the person is shown: each cell the run would run, its source and the source's hash."""
        return await describe_run(self.runner, self._path, body)

    async def _bind(self, approval: Approval, body: Any) -> Any:
        """Run only what the person approved (409 naming the cells that differ now)."""
        return await bind_run(self.runner, approval, self._path, body)

    @web.authenticated
    @authorized
    async def post(self, path: str = "") -> None:
        user = self.current_user
        if not await ensure_async(self.authorizer.is_authorized(self, user, "execute", "kernels")):
            raise web.HTTPError(
                403, "User is not authorized to execute on resource: kernels (running a notebook needs it)."
            )
        self._path = path
        await self._respond(await self.json_body())


class NotebookKernelHandler(AgentAPIHandler):
    """GET describes the notebook's own kernel (``read`` on ``kernels``); POST interrupts, restarts or
    shuts it down (``execute`` on ``kernels``)."""

    route_name = "notebook_kernel"

    auth_resource = "kernels"

    @property
    def runner(self) -> NotebookRunner:
        return self.app.notebook_runner

    @web.authenticated
    @authorized("read")
    async def get(self, path: str) -> None:
        await self.write_json(await self.runner.kernel(path))

    @web.authenticated
    @authorized("execute")
    async def post(self, path: str) -> None:
        gate_body = await self.json_body()

        async def apply(body: Any) -> tuple[dict[str, Any], int]:
            return await self.runner.kernel_action(path, body), 200

        describe = describe_kernel_action(path, without_gate_fields(gate_body))
        await self.respond_gated("kernel", path, describe, gate_body, apply)
