"""Start, connect to, interrupt and shut down kernels through the server's own kernel manager.

The kernel manager is the shared gateway: local kernels, or a remote gateway when the server runs with
``--gateway-url``. Kernels started here show in ``/api/kernels`` and JupyterLab's running panel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from jupyter_core.utils import ensure_async

from .connection import KernelConnection, LocalKernelConnection

log = logging.getLogger(__name__)


def is_gateway(kernel_manager: Any) -> bool:
    """Whether the server's kernels live on a remote gateway."""
    try:
        from jupyter_server.gateway.managers import GatewayMappingKernelManager
    except ImportError:  # pragma: no cover - very old jupyter_server
        return False
    return isinstance(kernel_manager, GatewayMappingKernelManager)


class KernelService:
    """The operations the eval sessions need from the kernel manager."""

    def __init__(self, kernel_manager: Any, *, ready_timeout: float = 60.0):
        self.kernel_manager = kernel_manager
        self.ready_timeout = ready_timeout

    @property
    def default_kernel_name(self) -> str:
        return str(getattr(self.kernel_manager, "default_kernel_name", "python3") or "python3")

    async def start(self, kernel_name: str | None, cwd: str) -> str:
        """Start a kernel in ``cwd`` (an API path) and return its id."""
        kwargs: dict[str, Any] = {"path": cwd}
        if kernel_name:
            kwargs["kernel_name"] = kernel_name
        kernel_id = await ensure_async(self.kernel_manager.start_kernel(**kwargs))
        return str(kernel_id)

    async def connect(self, kernel_id: str) -> KernelConnection:
        """An open connection to a running kernel (its own client identity)."""
        if is_gateway(self.kernel_manager):
            from .gateway import GatewayKernelConnection

            conn: KernelConnection = GatewayKernelConnection(self.kernel_manager, kernel_id)
        else:
            conn = LocalKernelConnection(self.kernel_manager, kernel_id)
        await conn.start(self.ready_timeout)
        return conn

    async def interrupt(self, kernel_id: str) -> None:
        await ensure_async(self.kernel_manager.interrupt_kernel(kernel_id))

    async def shutdown(self, kernel_id: str) -> None:
        """Shut a kernel down; a kernel already gone is not an error."""
        if kernel_id not in self.kernel_manager:
            return
        try:
            await ensure_async(self.kernel_manager.shutdown_kernel(kernel_id, now=False))
        except Exception:
            log.debug("graceful shutdown of kernel %s failed; killing it", kernel_id, exc_info=True)
            with contextlib.suppress(Exception):
                await ensure_async(self.kernel_manager.shutdown_kernel(kernel_id, now=True))

    def list_kernel_ids(self) -> list[str]:
        return list(self.kernel_manager.list_kernel_ids())


async def close_quietly(conn: KernelConnection | None) -> None:
    """Close a connection, never raising (used in ``finally`` blocks)."""
    if conn is None:
        return
    try:
        await asyncio.shield(conn.close())
    except BaseException:
        log.debug("closing kernel connection failed", exc_info=True)
