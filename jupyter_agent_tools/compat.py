"""The one place that relies on other packages' internals, each where no public API does the job.

Tested with jupyter_server 2.21 (``FileContentsManager``, ``AsyncFileContentsManager``, the large-file
managers, ``MappingKernelManager``), jupyter_client 8.10 (``MultiKernelManager``, ``Session``),
jupyter-collaboration 5.0 / jupyter_server_ydoc 3.0 (``DocumentRoom``, its ``ystore``), jupyter_events 0.12
(``EventLogger``) and prometheus_client 0.2x (``REGISTRY``). ``tests/test_compat.py`` fails loudly if an
upstream shape changes (``tests/test_activity.py`` for jupyter_server's activity watching, whose
``record_activity`` ``execution/activity.py`` follows: see docs/decisions/0003-held-kernel-activity.md).

The process-wide patches are applied together by :func:`install`, once, when the extension loads
(``AgentToolsApp._load_jupyter_server_extension``, before anything that could fail); instance wraps of an
upstream object's method go through :func:`wrap_once`. ``tests/test_compat_boundary.py`` fails on a
private upstream read or a patch outside this module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tornado import web

# What jupyter_server's managers (contents, kernels, sessions, the gateway client) raise for an HTTP status:
# the services catch it by this name, and never import Tornado themselves.
ServerHTTPError = web.HTTPError


def local_os_path(contents_manager: Any, path: str) -> str | None:
    """The file system path behind API ``path``, or None when the contents manager is not a local disk.

    A local-disk contents manager is a ``FileContentsManager`` or ``AsyncFileContentsManager`` (or a
    subclass) that keeps their private ``_get_os_path(path)`` and a ``root_dir``: it maps an API path to
    an absolute path under ``root_dir`` and raises ``tornado.web.HTTPError(404)`` for a path outside the
    root (checked with jupyter_server 2.21). Any other contents manager (a database, S3...) gives None.
    """
    get_os_path = getattr(contents_manager, "_get_os_path", None)
    root = getattr(contents_manager, "root_dir", None)
    if not callable(get_os_path) or not isinstance(root, str) or not root:
        return None
    os_path = get_os_path(path)
    return os_path if isinstance(os_path, str) else None


def local_root(contents_manager: Any) -> str | None:
    """The root directory of a local-disk contents manager (see :func:`local_os_path`), or None."""
    if not callable(getattr(contents_manager, "_get_os_path", None)):
        return None
    root = getattr(contents_manager, "root_dir", None)
    return root if isinstance(root, str) and root else None


# MultiKernelManager keeps a kernel whose start failed in its pending table (jupyter_client 8.10), and
# MappingKernelManager keeps its connection count and ports (jupyter_server 2.21); no public call
# forgets them. remove_kernel() is public but only clears the running table.
_KERNEL_TABLES = ("_pending_kernels", "_kernel_connections", "_kernel_ports")


def forget_kernel(kernel_manager: Any, kernel_id: str) -> None:
    """Drop every trace of ``kernel_id`` from the kernel manager (after a failed start or a kernel that
    can no longer be reached), without shutting anything down."""
    remove = getattr(kernel_manager, "remove_kernel", None)
    if callable(remove):
        remove(kernel_id)
    for attr in _KERNEL_TABLES:
        table = getattr(kernel_manager, attr, None)
        if isinstance(table, dict):
            table.pop(kernel_id, None)


def activity_watched(kernel: Any) -> bool:
    """Whether jupyter_server's activity watcher reads this kernel's iopub: ``MappingKernelManager``'s
    ``start_watching_activity`` keeps its stream as the kernel's private ``_activity_stream`` and
    ``stop_watching_activity`` sets it to None (jupyter_server 2.x)."""
    return getattr(kernel, "_activity_stream", None) is not None


def pending_ready(kernel_manager: Any, kernel_id: str) -> asyncio.Future[Any] | None:
    """The kernel's ``ready`` future while it is not done (its start runs, or was cancelled), else None."""
    try:
        ready = getattr(kernel_manager.get_kernel(kernel_id), "ready", None)
    except (KeyError, web.HTTPError):
        return None
    return ready if isinstance(ready, asyncio.Future) and not ready.done() else None


def settle_abandoned_start(kernel_manager: Any, kernel_id: str) -> bool:
    """Cancel the ``ready`` future of a kernel whose start was cancelled; return whether it did.

    jupyter_client resolves ``ready`` when ``start_kernel`` returns or raises an Exception, not when the
    start is cancelled: the future then stays pending, and shutting that kernel down (ours, or the
    server's ``shutdown_all`` at stop) raises InvalidStateError. A start still running is left alone.
    """
    ready = pending_ready(kernel_manager, kernel_id)
    if ready is None:
        return False
    task = (getattr(kernel_manager, "_pending_kernels", None) or {}).get(kernel_id)
    if isinstance(task, asyncio.Future) and not task.done():
        return False
    ready.cancel()
    return True


def room_is_settled(room: Any) -> bool:
    """Whether a jupyter-collaboration room is neither loading nor reloading its document from disk.

    ``ready`` is public; a reload holds the room's ``_update_lock`` across awaits, and a progressive
    first load resolves ``_document_progressively_loaded`` (jupyter_server_ydoc 3.0 ``DocumentRoom``).
    Rooms without these attributes (other implementations) count as settled once ``ready``.
    """
    if not getattr(room, "ready", True):
        return False
    lock = getattr(room, "_update_lock", None)
    if lock is not None and lock.locked():
        return False
    loaded = getattr(room, "_document_progressively_loaded", None)
    progressive = getattr(room, "_document_load_progressively", False)
    return not (progressive and loaded is not None and not loaded.done())


def room_store(api: Any, room_id: str) -> Any:
    """The Y store of a jupyter-collaboration room (``YRoom.ystore``, pycrdt-store's ``BaseYStore``, whose
    ``write(update)`` is public), or None: no store, no such room, or rooms that cannot be inspected."""
    rooms = getattr(getattr(api, "ywebsocket_server", None), "rooms", None)
    room = rooms.get(room_id) if isinstance(rooms, Mapping) else None
    store = getattr(room, "ystore", None)
    return store if callable(getattr(store, "write", None)) else None


def room_saver(api: Any, room_id: str) -> Callable[[], Awaitable[Any] | None] | None:
    """What has a jupyter-collaboration room save its document to its file now, or None (no such room, or
    rooms that cannot be inspected).

    The room autosaves a change after a delay, in a task (``DocumentRoom._saving_document``,
    jupyter_server_ydoc 3.0) that a stopping room cancels ("TODO: Should we cancel or wait?"); the
    restarted room then takes the file over its store, and an answered edit is gone. The saver calls
    ``_save_to_disc`` (what the room's websocket handler calls for a client's save: the same save without
    the delay, returning its task) only while such an autosave is pending: with autosave off (every client
    turned it off, or the room's delay is None) the file is left as the person chose. None from the saver:
    nothing to wait for.
    """
    rooms = getattr(getattr(api, "ywebsocket_server", None), "rooms", None)
    room = rooms.get(room_id) if isinstance(rooms, Mapping) else None
    save = getattr(room, "_save_to_disc", None)
    if not callable(save):
        return None

    def save_pending() -> Awaitable[Any] | None:
        if getattr(room, "_save_delay", 0) is None:
            return None
        pending = getattr(room, "_saving_document", None)
        if not isinstance(pending, asyncio.Future) or pending.done():
            return None
        saving = save()
        return saving if isinstance(saving, asyncio.Future) else None

    return save_pending


def live_outputs_factory(ynotebook: Any) -> Any:
    """The function that turns nbformat outputs into a live notebook's Y outputs, or None.

    ``YNotebook._create_youtputs`` (jupyter_ydoc 3 and 4; checked with 4.2) is what the document itself
    uses when it loads a cell; there is no public equivalent. Without it, cells whose outputs change are
    re-created instead of updated in place.
    """
    factory = getattr(ynotebook, "_create_youtputs", None)
    return factory if callable(factory) else None


def remember_signature(session: Any, signature: bytes) -> None:
    """Add a message's signature to ``Session``'s replay memory, as ``Session.deserialize`` does (its
    private ``_add_digest``, jupyter_client 8.x): the connection's own decode of protocol-5 messages
    (docs/decisions/0002-protocol5-decode.md) refuses a replayed message exactly as ``deserialize``."""
    session._add_digest(signature)


def registered_collectors(registry: Any) -> list[Any]:
    """Every collector ``registry`` (prometheus_client's ``REGISTRY``) holds: its private
    ``_collector_to_names`` (no public listing)."""
    return list(getattr(registry, "_collector_to_names", {}))


def registered_metric(registry: Any, name: str) -> Any:
    """The collector ``registry`` (prometheus_client's ``REGISTRY``) holds under ``name``, or None.

    prometheus_client refuses to register a name twice and has no public lookup; its private
    ``_names_to_collectors`` maps names to collectors. Metrics are defined once per process through this,
    so a second server (tests, a restart in the same process) reuses them."""
    return getattr(registry, "_names_to_collectors", {}).get(name)


def event_listeners(logger: Any) -> tuple[Any, Any]:
    """jupyter_events ``EventLogger``'s listener tables by schema id (``_modified_listeners``,
    ``_unmodified_listeners``, 0.12; None where missing): whether an event would reach a listener,
    which has no public question."""
    return getattr(logger, "_modified_listeners", None), getattr(logger, "_unmodified_listeners", None)


def guard_control_sockets() -> None:
    """Keep jupyter_client's shutdown request from waiting forever on a kernel's control socket.

    ``KernelManager._async_request_shutdown`` (jupyter_client 8.x) sends on ``_control_socket`` with no
    timeout, after ``_connect_control_socket`` made sure one exists. When the kernel died and another
    process bound its control port with a socket of a kind a DEALER cannot talk to (ports are picked at
    random), the control socket's reconnect fails its handshake and keeps no peer: ZMQ then holds every
    send, and a blocking socket holds the server's event loop with it (seen in this project's suite: a
    server frozen in that send after a notebook's kernel died at start). Patched once per process: a
    control socket that cannot take a message is replaced by a fresh one, which queues it (the kernel is
    killed after the shutdown wait if nobody reads it). Idempotent; ``tests/test_compat.py`` checks it.
    """
    import zmq
    from jupyter_client.manager import KernelManager

    original = KernelManager._connect_control_socket
    if getattr(original, "guarded_by_agent_tools", False):
        return

    def _connect_control_socket(self: Any) -> None:
        socket = self._control_socket
        if socket is not None and not _can_send(socket, zmq):
            with contextlib.suppress(zmq.ZMQError):
                self._close_control_socket()
            self._control_socket = None
        original(self)

    _connect_control_socket.guarded_by_agent_tools = True  # type: ignore[attr-defined]
    KernelManager._connect_control_socket = _connect_control_socket  # type: ignore[method-assign]


def _can_send(socket: Any, zmq: Any) -> bool:
    try:
        return not socket.closed and bool(socket.get(zmq.EVENTS) & zmq.POLLOUT)
    except zmq.ZMQError:  # its context was terminated, or it was closed meanwhile
        return False


def guard_page_token() -> None:
    """Let an identity provider keep the server's token out of the pages it does not belong in.

    jupyter_server renders every HTML page (``page.html``: the error pages of ``/files``, ``/view``,
    ``/nbconvert``, a 403, a refused websocket handshake, ``/logout``) with ``data-jupyter-api-token`` set
    from the handler's ``token`` (a property of ``AuthenticatedHandler``) for any logged-in user
    (jupyter_server 2.21), and no public hook decides per request. Patched once per process: a handler's
    ``token`` is None when its identity provider's ``hides_token_from(handler)`` says so (an agent's
    request), else the server's token as before. Idempotent; ``tests/test_compat.py`` checks it.
    """
    from jupyter_server.base.handlers import AuthenticatedHandler

    original: Any = AuthenticatedHandler.__dict__["token"]  # the property itself (JupyterHandler's base)
    if getattr(original.fget, "guarded_by_agent_tools", False):
        return

    def token(self: Any) -> str | None:
        hides = getattr(self.settings.get("identity_provider"), "hides_token_from", None)
        if hides is not None and hides(self):
            return None
        return original.fget(self)

    token.guarded_by_agent_tools = True  # type: ignore[attr-defined]
    AuthenticatedHandler.token = property(token, doc=original.__doc__)  # type: ignore[method-assign,assignment]


def guard_contents_listings() -> None:
    """Let an identity provider leave entries out of ``/api/contents`` directory listings.

    jupyter_server's ``ContentsHandler`` answers every model through ``_finish_model`` (jupyter_server
    2.21), and a directory's model lists its entries whatever the authorizer allowed for the directory
    itself: a symlink inside an agent's paths that leads outside them, or an entry a glob naming only the
    directory does not reach. Patched once per process: a directory model keeps only the entries for which
    the identity provider's ``lists_for(handler, path)`` is true. Idempotent; ``tests/test_compat.py``.
    """
    from jupyter_server.services.contents.handlers import ContentsHandler

    original: Any = ContentsHandler._finish_model
    if getattr(original, "guarded_by_agent_tools", False):
        return

    def _finish_model(self: Any, model: Any, location: bool = True) -> Any:
        lists_for = getattr(self.settings.get("identity_provider"), "lists_for", None)
        entries = (
            model.get("content") if isinstance(model, dict) and model.get("type") == "directory" else None
        )
        if lists_for is not None and isinstance(entries, list):
            kept = [e for e in entries if not isinstance(e, dict) or lists_for(self, str(e.get("path", "")))]
            model = {**model, "content": kept}
        return original(self, model, location)

    _finish_model.guarded_by_agent_tools = True  # type: ignore[attr-defined]
    ContentsHandler._finish_model = _finish_model  # type: ignore[method-assign]


def _dropped(message: Any) -> None:
    """What a muted websocket does with a message it receives: nothing."""
    return None


def mute_websocket(handler: Any) -> None:
    """Drop every message the Tornado websocket ``handler`` receives from now on, at once.

    ``WebSocketHandler.close`` sends a close frame and keeps delivering the client's messages until the
    client answers it (or 5 s pass); a kernel's websocket forwards each to the kernel. Tornado's protocol
    (``WebSocketProtocol13._handle_message``, tornado 6.x) looks the handler's ``on_message`` up for every
    message, and every websocket handler (kernels, terminals, events, collaboration rooms) receives through
    it, with no public per-connection hook: an attribute of this instance shadows the class's method.
    ``tests/test_compat.py`` checks it on a real websocket.
    """
    handler.__dict__["on_message"] = _dropped


def websocket_muted(handler: Any) -> bool:
    return handler.__dict__.get("on_message") is _dropped


def detach_from_loop(socket: Any) -> None:
    """Stop the event loop from watching an asyncio ZMQ socket: pyzmq's ``zmq.asyncio.Socket`` watches its
    descriptor for good once it was awaited, and ``_clear_io_state`` (pyzmq 25-27) is what its ``close``
    calls to stop that; no public call does it without closing."""
    clear = getattr(socket, "_clear_io_state", None)
    if clear is not None:
        clear()


def cached_user(handler: Any, default: Any = None) -> Any:
    """The user jupyter_server's ``JupyterHandler`` found for this request (``_jupyter_current_user``,
    set once authentication ran: None for nobody), or ``default`` before it ran."""
    return getattr(handler, "_jupyter_current_user", default)


def mark_token_authenticated(handler: Any) -> None:
    """Say that ``handler``'s request came with a token, not a cookie (``_token_authenticated``, which
    JupyterHub's patch of jupyter_server's XSRF check reads): no XSRF check for it."""
    handler._token_authenticated = True


def allows_unauthenticated(method: Any) -> bool:
    """Whether a handler method carries jupyter_server's ``@allow_unauthenticated`` (the attribute
    ``__allow_unauthenticated`` it sets, jupyter_server 2.13+)."""
    return bool(getattr(method, "__allow_unauthenticated", False))


def response_finished(handler: Any) -> bool:
    """Whether Tornado's ``RequestHandler.finish`` already ran for ``handler`` (its ``_finished``, tornado
    6.x: no public question)."""
    return bool(handler._finished)


def status_reason(handler: Any) -> str:
    """The reason phrase of ``handler``'s status (Tornado keeps it as ``_reason``, tornado 6.x)."""
    return str(handler._reason)


# The attribute that marks a method wrapped by wrap_once, with the key of the wrap.
_WRAPPED = "wrapped_by_agent_tools"


def wrap_once(obj: Any, name: str, key: str, wrap: Callable[[Any], Any]) -> bool:
    """Replace ``obj.name`` (an upstream object's method: the contents manager's ``save``, the gateway
    kernel manager's ``start_kernel``) by ``wrap(original)``, unless a wrap of this ``key`` is already
    there; whether it wrapped. The one way an instance of another package is patched."""
    original = getattr(obj, name)
    if getattr(original, _WRAPPED, None) == key:
        return False
    wrapped = wrap(original)
    setattr(wrapped, _WRAPPED, key)
    setattr(obj, name, wrapped)
    return True


def install() -> None:
    """Apply the process-wide patches (each once, idempotent): called when the extension loads."""
    guard_control_sockets()  # a dead kernel's control socket must not freeze the server
    guard_page_token()  # pages rendered for an agent carry no server token (hides_token_from)
    guard_contents_listings()  # an agent's /api/contents listings hold only its paths (lists_for)
