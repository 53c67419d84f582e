"""jupyter_server's activity watching of a kernel, done from the eval's own iopub connection.

jupyter_server reads every iopub message of every kernel it manages a second time, only to keep
``last_activity`` and ``execution_state`` (``/api/kernels``, the idle culler). While an eval connection
reads the same messages anyway, that second reader doubles the server's work and memory during an
output flood (each message is received, copied and checked twice; a 100 MB print is held twice). So a
connection *holds* the kernel's activity: jupyter_server's watcher is stopped and the connection records
activity exactly as the watcher's ``record_activity`` does (jupyter_server 2.x, with
``track_message_type``); when the last holder lets go, the watcher is started again.

A connection lets go when it closes, and also while it cannot take messages (its queue is full and no
run drains it, for example between calls while another client floods the kernel): jupyter_server then
watches again, so the kernel's activity never goes stale behind a paused connection.
"""

from __future__ import annotations

import logging
import weakref
from datetime import datetime, timezone
from typing import Any

from ..compat import ServerHTTPError, activity_watched

log = logging.getLogger(__name__)

# per kernel (jupyter_client's KernelManager of the kernel): how many connections hold its activity, and
# whether the first of them stopped jupyter_server's watcher (only then is it started again)
_holders: weakref.WeakKeyDictionary[Any, tuple[int, bool]] = weakref.WeakKeyDictionary()


class KernelActivity:
    """One connection's hold on one kernel's activity bookkeeping (see the module's docstring)."""

    def __init__(self, kernel_manager: Any, kernel_id: str, kernel: Any) -> None:
        self.kernel_manager = kernel_manager
        self.kernel_id = kernel_id
        self.kernel = kernel
        self.held = False

    @classmethod
    def of(cls, kernel_manager: Any, kernel_id: str) -> KernelActivity | None:
        """The activity of a kernel watched by jupyter_server's manager; None for any other manager."""
        if not all(
            callable(getattr(kernel_manager, name, None))
            for name in ("track_message_type", "start_watching_activity", "stop_watching_activity")
        ):
            return None
        try:
            kernel = kernel_manager.get_kernel(kernel_id)
        except (KeyError, ServerHTTPError):
            return None
        return cls(kernel_manager, kernel_id, kernel)

    def hold(self) -> None:
        """Record activity here; the first holder of the kernel stops jupyter_server's watcher."""
        if self.held:
            return
        count, took = _holders.get(self.kernel, (0, False))
        if not count:
            took = activity_watched(self.kernel)
            try:
                self.kernel_manager.stop_watching_activity(self.kernel_id)
            except Exception:
                # broad: best effort: jupyter_server's watcher may fail any way on a kernel going away; logged
                log.debug("could not stop watching kernel %s", self.kernel_id, exc_info=True)
                return
        _holders[self.kernel] = (count + 1, took)
        self.held = True

    def release(self) -> None:
        """Stop recording; the last holder starts jupyter_server's watcher again if the first one stopped
        it (and the kernel is still the manager's and not watched already, as after a restart on new
        ports)."""
        if not self.held:
            return
        self.held = False
        count, took = _holders.get(self.kernel, (1, False))
        if count > 1:
            _holders[self.kernel] = (count - 1, took)
            return
        _holders.pop(self.kernel, None)
        km = self.kernel_manager
        try:
            ours = self.kernel_id in km and km.get_kernel(self.kernel_id) is self.kernel
            if took and ours and not activity_watched(self.kernel):
                km.start_watching_activity(self.kernel_id)
        except Exception:
            # broad: re-watching is best effort: jupyter_server's watcher may fail any way on a kernel going
            # away
            log.debug("could not watch kernel %s again", self.kernel_id, exc_info=True)

    def record(self, msg: dict[str, Any]) -> None:
        """What jupyter_server's ``record_activity`` does with an iopub message (while held); compared with
        it message by message in ``tests/test_activity.py``."""
        if not self.held:
            return
        km, kernel = self.kernel_manager, self.kernel
        msg_type = msg.get("msg_type")
        parent_type = (msg.get("parent_header") or {}).get("msg_type")
        tracked = km.track_message_type(msg_type) or km.track_message_type(parent_type)
        if tracked or kernel.execution_state == "busy":
            km.last_kernel_activity = kernel.last_activity = datetime.now(timezone.utc)
        if msg_type == "status":
            state = (msg.get("content") or {}).get("execution_state")
            if km.track_message_type(parent_type):
                kernel.execution_state = state
            elif kernel.execution_state == "starting" and state != "starting":
                kernel.execution_state = "idle"  # as jupyter_server normalizes the first state after start
