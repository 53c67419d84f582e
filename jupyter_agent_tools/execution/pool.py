"""Warm kernels for per-call evals and new sessions: started ahead, each used once.

The pool keeps up to ``size`` kernels of the server's default kernel spec started (through the server's
kernel manager, so they work with a gateway too) and connected. A call that needs a new kernel of that
spec takes one (:meth:`KernelPool.take`) and the pool starts a replacement in the background; a pooled
kernel is never given back: it runs one per-call eval (or one session's life) and is shut down by its
taker. The init step (cwd, environment, ``sys.path``) runs on it when it is taken, like on any new kernel.

Filling starts at the first eval (:meth:`KernelPool.start`), not at server start: a server whose agents
never eval keeps no extra kernel. Pooled kernels hold file descriptors like any kernel: a refill waits
while fewer than twice ``KernelService.fd_headroom`` descriptors are free, and the recovery policy shuts
the pool down (:meth:`KernelPool.release`) before idle sessions when a start runs out of descriptors.
Pooled kernels are not sessions: listings show only their count (:meth:`KernelPool.describe`).

On a gateway the pool is off unless configured (a pooled kernel is an idle pod counted against the user's
kernel cap); a configured one gives way: a kernel creation the gateway refuses for its cap releases the pool
(:func:`~.gateway.watch_kernel_cap`), and a refill refused for it waits as long as after a release.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from traitlets import Float, Instance, Int, default, validate

from ..audit import metrics as audit_metrics
from ..service import Service, at_least
from .connection import KernelConnection
from .faults import fd_usage, is_kernel_cap
from .gateway import POOL_START
from .kernel_service import KernelService, close_quietly

log = logging.getLogger(__name__)

# Seconds before a refill is tried again after a failed start (doubling up to the maximum), and between
# looks at the descriptor count while descriptors are short.
RETRY_DELAY, MAX_RETRY_DELAY = 1.0, 60.0


class KernelPool(Service):
    """Up to ``size`` started, connected kernels of the default spec, each handed out once."""

    kernels = Instance(KernelService, help="Starts, connects to and shuts down the pooled kernels.")
    size = Int(
        1,  # the gateway's default: _default_size
        help="Warm kernels of the default kernel spec kept started for per-call evals and new sessions "
        "(0 disables). Default 1; 0 when the kernels run on a gateway (GatewayClient.url set: a pooled "
        "kernel is an idle pod counted against the user's kernel cap). Filling starts at the first eval; "
        "each pooled kernel runs one call (or one session) and is shut down, then the pool starts another. "
        "Pooled kernels are not sessions, hold file descriptors like any kernel (a refill waits while fewer "
        "than 2 x fd_headroom are free) and are shut down first when a kernel start runs out of descriptors "
        "or a gateway refuses a kernel for its per-user cap.",
    ).tag(config=True)
    retry_delay = Float(RETRY_DELAY, help="Seconds before a failed refill is tried again (doubling).")

    @default("size")
    def _default_size(self) -> int:
        return 0 if self.kernels is not None and self.kernels.gateway else 1

    @validate("size")
    def _valid_size(self, proposal: Any) -> int:
        return int(at_least(proposal, 0))

    @validate("retry_delay")
    def _valid_delay(self, proposal: Any) -> float:
        return float(at_least(proposal, 0, strict=True))

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        # (kernel name, id, connection), oldest first
        self.ready: list[tuple[str, str, KernelConnection]] = []
        self.kernel_name: str | None = None  # the spec pooled: the kernel manager's default at first fill
        self.taken = 0  # kernels handed out since the server started
        self._starting = 0
        self._filler: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self._paused_until = 0.0  # released under descriptor pressure: no refill before this loop time
        audit_metrics.track(pool=self)

    # -- figures -------------------------------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        return len(self.ready)

    @property
    def starting_count(self) -> int:
        return self._starting

    @property
    def kernel_ids(self) -> list[str]:
        """Ids of the kernels waiting in the pool (not those being started)."""
        return [kernel_id for _, kernel_id, _ in self.ready]

    def describe(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "ready": self.ready_count,
            "starting": self.starting_count,
            "kernel_name": self.kernel_name,
            "taken": self.taken,
        }

    # -- life ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin filling in the background (needs a running event loop); idempotent."""
        if self.size > 0 and self._filler is None and not self._closed:
            self._filler = asyncio.ensure_future(self._fill_forever())

    async def take(self, kernel_name: str) -> tuple[str, KernelConnection] | None:
        """A ready kernel of ``kernel_name`` (the caller owns it from now on), or None: start your own.

        A pooled kernel found dead is shut down and the next one tried. Taking wakes the refill.
        """
        self.start()
        while self.ready and not self._closed:
            if kernel_name != self.ready[0][0]:
                return None
            entry = self.ready.pop(0)
            _, kernel_id, connection = entry
            try:
                alive = not connection.lost_state and await connection.is_alive()
            except BaseException:  # the caller was cancelled: the kernel stays in the pool
                self.ready.insert(0, entry)
                raise
            self._wake.set()
            if alive:
                self.taken += 1
                return kernel_id, connection
            self.log.warning("pooled kernel %s was found dead; shutting it down", kernel_id)
            await self._discard(kernel_id, connection)
        return None

    async def release(self) -> list[str]:
        """Shut down every ready kernel (descriptors are short); refills pause for a while."""
        loop = asyncio.get_running_loop()
        self._paused_until = loop.time() + MAX_RETRY_DELAY
        victims, self.ready = self.ready, []
        await asyncio.gather(*(self._discard(k, c) for _, k, c in victims), return_exceptions=True)
        return [kernel_id for _, kernel_id, _ in victims]

    async def shutdown(self) -> None:
        """Stop filling and shut every pooled kernel down, those being started included (server stop)."""
        self._closed = True
        self._wake.set()
        filler, self._filler = self._filler, None
        if filler is not None:
            # broad: the cancelled filler's own end (cancelled or failed): the shutdown goes on
            with contextlib.suppress(BaseException):
                await filler  # it finishes a start in progress and shuts that kernel down itself
        victims, self.ready = self.ready, []
        await asyncio.gather(*(self._discard(k, c) for _, k, c in victims), return_exceptions=True)

    # -- filling -------------------------------------------------------------------------------------

    async def _fill_forever(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self.retry_delay
        while not self._closed:
            wait: float | None = None
            if len(self.ready) >= self.size:
                wait = None  # full: sleep until a take or shutdown
            elif loop.time() < self._paused_until or not self._room_for_a_kernel():
                wait = max(self.retry_delay, min(self._paused_until - loop.time(), MAX_RETRY_DELAY))
            elif await self._start_one():
                delay = self.retry_delay
                continue
            else:
                wait, delay = delay, min(delay * 2, MAX_RETRY_DELAY)
            self._wake.clear()
            if self._closed:
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    def _room_for_a_kernel(self) -> bool:
        """Whether a pooled kernel leaves session starts their descriptor headroom (local kernels)."""
        if self.kernels.gateway or self.kernels.fd_headroom == 0:
            return True
        usage = fd_usage()
        return usage is None or usage.headroom >= 2 * self.kernels.fd_headroom

    async def _start_one(self) -> bool:
        """Start and connect one kernel into the pool; False (logged) when the start failed."""
        kernel_name = self.kernel_name = self.kernels.default_kernel_name
        self._starting += 1
        try:
            # Shielded: shutting the pool down waits for a start in progress instead of abandoning a
            # half-started kernel in the manager.
            token = POOL_START.set(True)  # hitting a gateway's kernel cap must not release the pool itself
            try:
                launching = asyncio.ensure_future(self.kernels.launch(kernel_name, ""))
            finally:
                POOL_START.reset(token)
            kernel_id, connection = await asyncio.shield(launching)
        except Exception as e:
            # broad: a warm kernel's start failing any way is logged and retried later: no caller waits on it
            if is_kernel_cap(e):  # the user's slots are theirs: wait as long as after a release
                self._paused_until = asyncio.get_running_loop().time() + MAX_RETRY_DELAY
            if not self._closed:  # else killed by the server's stop
                self.log.warning(
                    "starting a pooled kernel failed (retried later): %s: %s", type(e).__name__, e
                )
            return False
        finally:
            self._starting -= 1
        if self._closed:
            await self._discard(kernel_id, connection)
            return True
        self.ready.append((kernel_name, kernel_id, connection))
        return True

    async def _discard(self, kernel_id: str, connection: KernelConnection) -> None:
        await close_quietly(connection)
        try:
            await self.kernels.shutdown(kernel_id)
        except Exception:
            # broad: a pooled kernel's shutdown failing any way must not stop the others; logged
            self.log.debug("shutting down pooled kernel %s failed", kernel_id, exc_info=True)
