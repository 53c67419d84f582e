"""Start, connect to, interrupt and shut down kernels through the server's own kernel manager.

The kernel manager is the shared gateway: local kernels, or a remote gateway when the server runs with
``--gateway-url``. Kernels started here show in ``/api/kernels`` and JupyterLab's running panel.

Each operation is one attempt: retrying a failed start (gateway 5xx, descriptor exhaustion) is the
recovery policy's (:mod:`.recovery`). :meth:`KernelService.translate` turns an expected start failure
into an :class:`~jupyter_agent_tools.errors.AgentToolsError` with a status a caller can act on.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import logging
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from jupyter_client.kernelspec import NoSuchKernel
from jupyter_core.utils import ensure_async
from traitlets import Any as AnyTrait
from traitlets import Bool, Float, Int, validate

from ..compat import ServerHTTPError, forget_kernel, pending_ready, settle_abandoned_start
from ..errors import RETRY_AFTER_KERNEL_START, AgentToolsError, BadRequest, Unavailable
from ..service import Service, at_least, in_range
from .connection import KernelConnection, LocalKernelConnection
from .faults import check_fd_headroom, fd_usage, http_message, http_status, is_fd_exhaustion

if TYPE_CHECKING:
    from .gateway import OwnedKernels

log = logging.getLogger(__name__)
# How often to look whether a kernel restarted by its manager runs again (restarts take ~0.5-2 s).
RESTART_POLL_INTERVAL = 0.1


def is_gateway(kernel_manager: Any) -> bool:
    """Whether the server's kernels live on a remote gateway."""
    try:
        from jupyter_server.gateway.managers import GatewayMappingKernelManager
    except ImportError:  # pragma: no cover - very old jupyter_server
        return False
    return isinstance(kernel_manager, GatewayMappingKernelManager)


def launch_timeout_hint() -> str:
    """What bounds a kernel start on a gateway, and what to raise when kernels take longer to start."""
    from jupyter_server.gateway.gateway_client import GatewayClient

    client = GatewayClient.instance()
    return (
        "the gateway did not start the kernel within GatewayClient.request_timeout="
        f"{client.request_timeout:g} s (KERNEL_LAUNCH_TIMEOUT={GatewayClient.KERNEL_LAUNCH_TIMEOUT} s, the "
        "gateway's own launch timeout): a kernel that takes longer to start, such as a pod whose image is "
        "pulled, needs both raised"
    )


class KernelService(Service):
    """The operations the eval sessions need from the kernel manager.

    The application builds the class named by ``AgentToolsApp.kernel_service_class``.
    """

    kernel_manager = AnyTrait(help="The server's kernel manager (local, or a gateway's).")
    ready_timeout = Float(
        60.0, help="Seconds to wait for a newly started kernel to answer before giving up."
    ).tag(config=True)
    fd_headroom = Int(
        64,
        help="Free file descriptors required before starting a local kernel; below it the start is treated "
        "as EMFILE (idle sessions are shut down and the start retried once). 0 disables the check.",
    ).tag(config=True)
    iopub_hwm = Int(
        2,
        help="Most kernel output messages ZMQ receives into the server (per kernel connection) beyond those "
        "the connection already holds (iopub_buffer_bytes). Counted in messages of any size: a kernel "
        "message may be 100 MB.",
    ).tag(config=True)
    iopub_buffer_bytes = Int(
        16 * 1024 * 1024,
        help="Bytes of kernel output messages a kernel connection holds in memory ahead of the code that "
        "processes them (a message that arrives with room left is taken whole); past it they go to a spill "
        "file (iopub_spill_bytes) and come back in order. 0: no limit (memory grows with a flood).",
    ).tag(config=True)
    iopub_spill_bytes = Int(
        1024**3,
        help="Bytes of kernel output messages a kernel connection keeps in a spill file on disk once "
        "iopub_buffer_bytes is full (the kernel never waits for a reader: what is not taken is lost). "
        "Past both, messages are dropped and logged, and the answer says so. 0: no spill file.",
    ).tag(config=True)
    check_ports = Bool(
        True,
        help="While a new local kernel (TCP, Linux) has not answered, look every 0.5 s whether another "
        "process listens on one of its ports (it then cannot bind it and never answers: it is replaced at "
        "once rather than after ready_timeout). False for kernelspecs whose ports are served by a process "
        "outside the kernel's own processes (a container's published ports, a port proxy).",
    ).tag(config=True)
    hold_activity = Bool(
        True,
        help="While an eval connection to a local kernel is open, it keeps the kernel's activity "
        "(last_activity, execution_state) for jupyter_server in place of jupyter_server's own iopub "
        "watcher, so the server reads each output message once instead of twice. False: jupyter_server's "
        "watcher always runs.",
    ).tag(config=True)

    @validate("ready_timeout")
    def _valid_ready_timeout(self, proposal: Any) -> float:
        return float(at_least(proposal, 0, strict=True))

    @validate("fd_headroom")
    def _valid_fd_headroom(self, proposal: Any) -> int:
        return int(at_least(proposal, 0))

    @validate("iopub_hwm")
    def _valid_iopub_hwm(self, proposal: Any) -> int:
        return in_range(proposal, 1, 100_000, "messages")

    @validate("iopub_spill_bytes")
    def _valid_iopub_spill(self, proposal: Any) -> int:
        return in_range(proposal, 0, 1024**4)

    @validate("iopub_buffer_bytes")
    def _valid_iopub_buffer(self, proposal: Any) -> int:
        return in_range(proposal, 0, 1024**3)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.started: set[str] = set()  # ids of kernels this extension started and has not shut down
        self.connecting: set[str] = set()  # ids of kernels waited for to answer (killed at server stop)
        self.stopping = False  # the server stops: no kernel is started any more
        # On a gateway: the kernels this server started, on disk for the next process (see .gateway)
        self.owned: OwnedKernels | None = None

    @property
    def gateway(self) -> bool:
        return is_gateway(self.kernel_manager)

    @property
    def default_kernel_name(self) -> str:
        return str(getattr(self.kernel_manager, "default_kernel_name", "python3") or "python3")

    async def check_kernel_name(self, kernel_name: str) -> None:
        """400 listing the installed kernel specs unless ``kernel_name`` is one of them.

        Checked before a session is touched, so a wrong name evicts, resets and creates nothing. When
        the specs cannot be listed (a gateway that is down), the start itself reports the failure.
        """
        ksm = self.kernel_manager.kernel_spec_manager
        try:
            if self.gateway:
                names = set((await ensure_async(ksm.get_all_specs())) or {})
            else:
                names = set(ksm.find_kernel_specs())
        except Exception:  # broad: a gateway's HTTP error or a broken kernel spec: no names listed; logged
            log.debug("listing kernel specs failed", exc_info=True)
            return
        if kernel_name not in names:
            raise BadRequest(
                f"No such kernel: {kernel_name!r} (available: {', '.join(sorted(names)) or 'none'})"
            )

    async def launch(self, kernel_name: str | None, cwd: str) -> tuple[str, KernelConnection]:
        """Start a kernel in ``cwd`` (an API path), connect to it, and return both (one attempt).

        A local start that fails while descriptors are nearly exhausted is raised as EMFILE; other
        failures are raised as they came (see :meth:`translate`). Retries are the recovery policy's.
        """
        self.refuse_if_stopping()
        try:
            return await self._launch_once(kernel_name, cwd)
        except Exception as e:
            # broad: any start failure is checked for descriptor exhaustion, then re-raised
            self._raise_if_out_of_descriptors(e)
            raise

    def _raise_if_out_of_descriptors(self, exc: Exception) -> None:
        """Treat a local start failure as EMFILE when descriptors are nearly exhausted.

        Measured here: with the server's descriptors exhausted, libzmq does not raise, the new client's
        sockets silently fail to connect and the start times out ("Kernel didn't respond"). Only the
        descriptor count tells what really happened.
        """
        if self.gateway or is_fd_exhaustion(exc):
            return
        usage = fd_usage()
        if usage is not None and usage.headroom < max(self.fd_headroom, 16):
            raise OSError(
                errno.EMFILE,
                f"Too many open files: the kernel start failed ({type(exc).__name__}: {exc}) with "
                f"{usage.describe()}",
            ) from exc

    def translate(self, exc: Exception, retried: bool = False) -> Exception:
        """An expected start failure as an error with a status; EMFILE and unknown errors unchanged."""
        if is_fd_exhaustion(exc) or isinstance(exc, AgentToolsError):
            return exc
        if isinstance(exc, NoSuchKernel):
            names = sorted(getattr(self.kernel_manager.kernel_spec_manager, "find_kernel_specs", dict)())
            return BadRequest(f"No such kernel: {exc.name!r} (available: {', '.join(names) or 'none'})")
        status = http_status(exc)
        message = http_message(exc)
        where = "kernel gateway" if self.gateway else "kernel manager"
        tried = " (tried twice)" if retried else ""
        if status is not None and 400 <= status < 500:
            if status == 404:
                return BadRequest(f"The {where} refused to create the kernel (HTTP 404): {message}")
            return AgentToolsError(
                f"The {where} refused to create the kernel (HTTP {status}): {message}", 400
            )
        if status is not None:
            # Unreachable gateways (503) and timeouts (599) are worth retrying later; other 5xx are the
            # gateway's own failure.
            code = 503 if status in (503, 599) else 502
            if status == 599 and self.gateway:
                message += f" ({launch_timeout_hint()})"
            return AgentToolsError(
                f"The {where} could not create a kernel{tried}: HTTP {status}: {message}",
                code,
                retry_after=RETRY_AFTER_KERNEL_START if code == 503 else None,
            )
        return AgentToolsError(
            f"The kernel failed to start{tried}: {type(exc).__name__}: {message}",
            503,
            retry_after=RETRY_AFTER_KERNEL_START,
        )

    async def _launch_once(self, kernel_name: str | None, cwd: str) -> tuple[str, KernelConnection]:
        kernel_id = await self.start(kernel_name, cwd)
        # Before it answers, too: a kernel that dies at start-up (its port taken by another process
        # meanwhile, "Address already in use") would be restarted by its manager on the same cached
        # ports, alive to ``is_alive`` and never answering, so the start waited ``ready_timeout`` and
        # failed. Left dead, it is seen dead at once and the recovery starts another kernel (new ports).
        self._stop_auto_restart(kernel_id)
        try:
            self.refuse_if_stopping()  # the server began to stop while the process was spawned
            conn = await self.connect(kernel_id)
        except BaseException:
            await self.shutdown(kernel_id, now=True)  # it never answered: nothing to shut down gently
            raise
        return kernel_id, conn

    async def start(self, kernel_name: str | None, cwd: str) -> str:
        """Start a kernel in ``cwd`` (an API path) and return its id."""
        kwargs: dict[str, Any] = {"path": cwd}
        if kernel_name:
            kwargs["kernel_name"] = kernel_name
        if self.gateway:
            if self.owned is not None:  # the owner tag (jupyter_server sends KERNEL_* to the gateway)
                kwargs["env"] = self.owned.env()
            kernel_id = str(await ensure_async(self.kernel_manager.start_kernel(**kwargs)))
            if self.owned is not None:
                await self.owned.add(kernel_id)
        else:
            check_fd_headroom(self.fd_headroom)
            # Choosing the id locally means a failed start can be cleaned up exactly (and only) here.
            # (With a gateway, passing kernel_id would mean "attach to an existing kernel".)
            kernel_id = str(uuid4())
            try:
                await ensure_async(self.kernel_manager.start_kernel(kernel_id=kernel_id, **kwargs))
            except BaseException:
                await self.forget_failed_start(kernel_id)
                raise
        self.started.add(kernel_id)
        return kernel_id

    def _stop_auto_restart(self, kernel_id: str) -> None:
        """Our kernels' lives are ours once they answered: a kernel that dies is replaced by the session's
        recovery, not restarted by its manager as well. Both at once raced (jupyter_client's restarter
        failed with ``InvalidStateError`` when the replaced kernel was shut down during its restart: an
        error traceback in the server log for every kernel death) and restarted a process nobody used."""
        with contextlib.suppress(KeyError, ServerHTTPError):  # KeyError, or jupyter_server's HTTPError(404)
            stop = getattr(self.kernel_manager.get_kernel(kernel_id), "stop_restarter", None)
            if callable(stop):
                stop()

    async def forget_failed_start(self, kernel_id: str) -> None:
        """Remove what a failed local start left in the kernel manager (pending entry, half-made kernel)."""
        km = self.kernel_manager
        if kernel_id in km:
            settle_abandoned_start(km, kernel_id)
            # broad: the kill is the last resort: its failure (any manager) leaves nothing else to do
            with contextlib.suppress(Exception):
                await ensure_async(km.shutdown_kernel(kernel_id, now=True))
        forget_kernel(km, kernel_id)

    async def connect(self, kernel_id: str, ready_timeout: float | None = None) -> KernelConnection:
        """An open connection to a running kernel (its own client identity), once the kernel answered
        within ``ready_timeout`` seconds (default: the ``ready_timeout`` trait)."""
        if self.gateway:
            from .gateway import GatewayKernelConnection

            conn: KernelConnection = GatewayKernelConnection(self.kernel_manager, kernel_id)
        else:
            conn = LocalKernelConnection(
                self.kernel_manager,
                kernel_id,
                iopub_hwm=self.iopub_hwm,
                iopub_buffer_bytes=self.iopub_buffer_bytes,
                iopub_spill_bytes=self.iopub_spill_bytes,
                hold_activity=self.hold_activity,
                check_ports=self.check_ports,
            )
        self.connecting.add(kernel_id)
        try:
            await conn.start(self.ready_timeout if ready_timeout is None else ready_timeout)
        finally:
            self.connecting.discard(kernel_id)
        return conn

    async def wait_until_restarted(self, kernel_id: str) -> bool:
        """After the kernel manager (or gateway) restarted a kernel under a connection: wait, bounded by
        ``ready_timeout``, until the new process runs. False when it does not come back."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        while True:
            try:
                kernel = self.kernel_manager.get_kernel(kernel_id)
                ready = getattr(kernel, "ready", None)  # jupyter_client: done when a (re)start finished
                if (ready is None or ready.done()) and await ensure_async(kernel.is_alive()):
                    return True
            except Exception:
                # broad: removed from the manager (404/KeyError), or a failed restart of any kind: not ready
                return False
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(RESTART_POLL_INTERVAL)

    async def interrupt(self, kernel_id: str) -> None:
        await ensure_async(self.kernel_manager.interrupt_kernel(kernel_id))

    async def restart(self, kernel_id: str, *, now: bool = True) -> None:
        """Restart a kernel in place (same id, what JupyterLab's "Restart Kernel" asks the server for),
        killing its process at once, and wait, bounded by ``ready_timeout``, until the new one answers.

        For a kernel that would not stop after an interrupt: a graceful shutdown request would only add
        the manager's ``shutdown_wait_time``. Raises when the restart fails or the kernel does not answer.
        ``now=False``: the graceful restart a person's "Restart Kernel" is.
        """
        restarted = await ensure_async(self.kernel_manager.restart_kernel(kernel_id, now=now))
        if inspect.isawaitable(restarted):  # jupyter_server: resolves on the new kernel's kernel_info_reply
            answered = asyncio.ensure_future(restarted)
            # jupyter_server fails it itself later (its kernel_info_timeout) when we stop waiting first
            answered.add_done_callback(lambda f: f.cancelled() or f.exception())
            await asyncio.wait_for(asyncio.shield(answered), self.ready_timeout)

    def refuse_if_stopping(self) -> None:
        """503 once the server stops: a kernel started now could outlive it."""
        if self.stopping:
            raise Unavailable("The server is shutting down: no kernel is started")

    async def stop(self) -> None:
        """Server stop: no kernel is started from now on, and kernels still starting (waited for to
        answer) are killed, not waited for. A start can outlast the time the server is given to stop
        (under load; one that never answers takes ``ready_timeout``): the server is then killed, and a
        kernel orphaned before it runs ipykernel's parent poller does not notice (it never does where a
        subreaper adopts it)."""
        self.stopping = True
        starting = list(self.connecting)
        await asyncio.gather(*(self.shutdown(k, now=True) for k in starting), return_exceptions=True)

    async def shutdown(self, kernel_id: str, *, now: bool = False) -> None:
        """Shut a kernel down (``now``: kill it); a kernel already gone is not an error."""
        self.started.discard(kernel_id)
        if kernel_id not in self.kernel_manager:
            await self._forget_owned(kernel_id)
            return
        await self._let_restart_finish(kernel_id)
        try:
            await ensure_async(self.kernel_manager.shutdown_kernel(kernel_id, now=now))
        except Exception:
            # broad: a graceful shutdown failing any way (a wedged kernel, a provisioner) falls back to a kill
            log.debug("graceful shutdown of kernel %s failed; killing it", kernel_id, exc_info=True)
            # broad: the kill is the last resort: its failure (any manager) leaves nothing else to do
            with contextlib.suppress(Exception):
                await ensure_async(self.kernel_manager.shutdown_kernel(kernel_id, now=True))
            # Ours and unreachable (e.g. its gateway is gone): do not keep a dead entry in the manager.
            await self.forget_failed_start(kernel_id)
            if self.gateway and kernel_id in self.kernel_manager:
                return  # still recorded: the next start of the server shuts it down
        await self._forget_owned(kernel_id)

    async def _forget_owned(self, kernel_id: str) -> None:
        if self.owned is not None:
            await self.owned.discard(kernel_id)

    def own_kernels_on_gateway(self, path: str) -> OwnedKernels | None:
        """On a gateway: record the kernels started from now on in the file ``path`` (tagged with this
        server's id and process) and return the record; None when the server's kernels are local."""
        if self.gateway and self.owned is None:
            from .gateway import OwnedKernels

            self.owned = OwnedKernels(path, self.log)
        return self.owned

    async def reap_orphans(self) -> list[str]:
        """Shut down the gateway kernels an earlier process of this server started and left behind (its
        record, see :class:`~.gateway.OwnedKernels`); logged. The ids shut down."""
        if self.owned is None or not self.owned.orphans():
            return []
        from .gateway import delete_gateway_kernel

        reaped, kept = await self.owned.reap(delete_gateway_kernel)
        if reaped or kept:
            self.log.warning(
                "jupyter_agent_tools: shut down %d kernel(s) on the gateway that an earlier process of this "
                "server started and left behind: %s%s",
                len(reaped),
                reaped,
                f"; {len(kept)} could not be and are tried at the next start: {kept}" if kept else "",
            )
        return reaped

    async def _let_restart_finish(self, kernel_id: str) -> None:
        """Wait (bounded by ``ready_timeout``) for a start or restart of the kernel that is under way:
        shutting a kernel down during its restart (``POST /api/kernels/{id}/restart``) breaks the
        restart, which shares the kernel's ``ready`` future. A restart is two pending phases (shutdown,
        start), hence the loop."""
        settle_abandoned_start(self.kernel_manager, kernel_id)
        deadline = asyncio.get_running_loop().time() + self.ready_timeout
        while (pending := pending_ready(self.kernel_manager, kernel_id)) is not None:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            # broad: the abandoned start's own outcome (any error) is not this call's
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(pending), left)


async def close_quietly(conn: KernelConnection | None) -> None:
    """Close a connection, never raising (used in ``finally`` blocks)."""
    if conn is None:
        return
    try:
        await asyncio.shield(conn.close())
    except BaseException:
        # broad: used in finally blocks: closing never raises, not even when cancelled
        log.debug("closing kernel connection failed", exc_info=True)
