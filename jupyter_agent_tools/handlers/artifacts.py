"""``/api/agent/artifacts/{id}``: the full text of a truncated output, whole or a byte range."""

from __future__ import annotations

import re

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..execution.eval_service import EvalService
from .base import AgentAPIHandler

CHUNK = 1 << 20
# One range of RFC 9110's form: "bytes=first-last", "bytes=first-" or "bytes=-suffix".
BYTE_RANGE = re.compile(r"^bytes=(?P<first>\d*)-(?P<last>\d*)$")


def byte_range(header: str | None, total: int) -> tuple[int, int] | None:
    """The ``(start, stop)`` a Range header asks of ``total`` bytes; None for no header or one this route
    ignores (several ranges, another unit, malformed: RFC 9110 lets a server answer those whole).
    Raises ValueError for a range that starts past the end."""
    match = BYTE_RANGE.match((header or "").strip())
    if match is None or (not match["first"] and not match["last"]):
        return None
    if not match["first"]:  # the last N bytes
        return max(0, total - int(match["last"])), total
    start = int(match["first"])
    stop = total if not match["last"] else min(total, int(match["last"]) + 1)
    if start >= total or stop <= start:
        raise ValueError(start)
    return start, stop


class ArtifactHandler(AgentAPIHandler):
    """GET returns an artifact's full text (``read`` on ``kernels``), or the byte range a ``Range``
    header asks for (206)."""

    auth_resource = "kernels"
    route_name = "artifact"

    @property
    def service(self) -> EvalService:
        return self.app.eval_service

    @web.authenticated
    @authorized("read")
    async def get(self, artifact_id: str) -> None:
        artifacts = self.service.artifacts
        total = artifacts.size(artifact_id)
        self.set_header("Accept-Ranges", "bytes")
        try:
            wanted = byte_range(self.request.headers.get("Range"), total)
        except ValueError:
            self.set_header("Content-Range", f"bytes */{total}")
            message = f"Range not satisfiable: artifact {artifact_id} has {total} bytes"
            await self.write_json({"message": message, "reason": "Range Not Satisfiable"}, 416)
            return
        start, stop = wanted or (0, total)
        if wanted is not None:
            self.set_status(206)
            self.set_header("Content-Range", f"bytes {start}-{stop - 1}/{total}")
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        while start < stop:
            chunk, _ = artifacts.read_range(artifact_id, start, min(CHUNK, stop - start))
            if not chunk:
                break
            start += len(chunk)
            self.write(chunk)
            await self.flush()
        self.finish()
