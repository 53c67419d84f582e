"""The jupyter_server internals jupyter_agent_tools relies on (all through jupyter_agent_tools/compat.py and
the file layout of jupyter_server's saves): these fail loudly when an upgrade changes them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from jupyter_server.services.contents.fileio import path_to_intermediate
from jupyter_server.services.contents.filemanager import AsyncFileContentsManager, FileContentsManager
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager, LargeFileManager
from jupyter_server.services.contents.manager import AsyncContentsManager, ContentsManager
from tornado.web import HTTPError

from jupyter_agent_tools.compat import local_os_path
from jupyter_agent_tools.notebook.disk import intermediate_path

LOCAL = [FileContentsManager, AsyncFileContentsManager, LargeFileManager, AsyncLargeFileManager]


@pytest.mark.parametrize("cls", LOCAL, ids=lambda c: c.__name__)
def test_local_contents_managers_map_api_paths_under_their_root(cls, tmp_path: Path) -> None:
    cm = cls(root_dir=str(tmp_path))
    assert local_os_path(cm, "dir/nb.ipynb") == str(tmp_path / "dir" / "nb.ipynb")
    assert local_os_path(cm, "nb.ipynb") == str(tmp_path / "nb.ipynb")
    for outside in ("../nb.ipynb", "dir/../../nb.ipynb"):
        with pytest.raises(HTTPError) as info:
            local_os_path(cm, outside)
        assert info.value.status_code == 404


@pytest.mark.parametrize("cls", [ContentsManager, AsyncContentsManager], ids=lambda c: c.__name__)
def test_other_contents_managers_are_not_a_local_disk(cls) -> None:
    assert local_os_path(cls(), "nb.ipynb") is None


def test_the_copy_jupyter_keeps_while_it_saves_is_where_the_store_looks_for_it(tmp_path: Path) -> None:
    os_path = str(tmp_path / "dir" / "nb.ipynb")
    assert intermediate_path(os_path) == path_to_intermediate(os_path) == str(tmp_path / "dir" / ".~nb.ipynb")


@pytest.mark.parametrize("cls", LOCAL, ids=lambda c: c.__name__)
def test_save_hooks_are_public_and_take_the_arguments_the_store_passes(cls, tmp_path: Path) -> None:
    calls: list[tuple[str, dict]] = []
    cm = cls(root_dir=str(tmp_path))
    cm.register_pre_save_hook(lambda **kw: calls.append(("pre", kw)))
    cm.register_post_save_hook(lambda **kw: calls.append(("post", kw)))
    model = {"type": "file", "format": "text", "content": "x"}
    cm.run_pre_save_hooks(model=model, path="nb.ipynb")
    cm.run_post_save_hooks(model=model, os_path=str(tmp_path / "nb.ipynb"))
    assert [(name, sorted(kw)) for name, kw in calls] == [
        ("pre", ["contents_manager", "model", "path"]),
        ("post", ["contents_manager", "model", "os_path"]),
    ]


def test_kernel_manager_tables_the_store_forgets_exist() -> None:
    """A failed start leaves the kernel id in these tables; forget_kernel must find them to clean up."""
    from jupyter_client.multikernelmanager import AsyncMultiKernelManager
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    from jupyter_agent_tools.compat import _KERNEL_TABLES, forget_kernel

    km = AsyncMappingKernelManager()
    for attr in _KERNEL_TABLES:
        assert isinstance(getattr(km, attr), dict), attr
        getattr(km, attr)["k"] = object()
    km._kernels["k"] = object()  # what remove_kernel() clears
    assert callable(AsyncMultiKernelManager.remove_kernel)
    forget_kernel(km, "k")
    assert all("k" not in getattr(km, attr) for attr in (*_KERNEL_TABLES, "_kernels"))


def test_collaboration_rooms_have_the_loading_state_the_live_store_waits_for() -> None:
    pytest.importorskip("jupyter_server_ydoc", reason="jupyter-collaboration is not installed")
    import inspect

    from jupyter_server_ydoc.rooms import DocumentRoom

    source = inspect.getsource(DocumentRoom.__init__)
    for attr in ("_update_lock", "_document_progressively_loaded", "_document_load_progressively"):
        assert f"self.{attr}" in source, attr
    assert isinstance(inspect.getattr_static(DocumentRoom, "ready", None), property) or "ready" in dir(
        DocumentRoom
    )


def test_a_collaboration_rooms_y_store_is_found_and_written_with_an_update(tmp_path: Path) -> None:
    pytest.importorskip("jupyter_server_ydoc", reason="jupyter-collaboration is not installed")
    import inspect
    from types import SimpleNamespace

    from pycrdt.store import SQLiteYStore
    from pycrdt.websocket import YRoom

    from jupyter_agent_tools.compat import room_store

    store = SQLiteYStore("json:notebook:x", str(tmp_path / "ystore.db"))
    api = SimpleNamespace(ywebsocket_server=SimpleNamespace(rooms={"json:notebook:x": YRoom(ystore=store)}))
    assert room_store(api, "json:notebook:x") is store
    assert room_store(api, "json:notebook:y") is None
    assert room_store(SimpleNamespace(), "json:notebook:x") is None
    assert list(inspect.signature(store.write).parameters) == ["data"]
    assert inspect.iscoroutinefunction(store.write)


def test_live_notebooks_can_build_outputs_in_place() -> None:
    pytest.importorskip("jupyter_ydoc", reason="jupyter-collaboration is not installed")
    from jupyter_ydoc import YNotebook

    from jupyter_agent_tools.compat import live_outputs_factory

    nb = YNotebook()
    cell = {"cell_type": "code", "source": "", "metadata": {}, "outputs": [], "execution_count": None}
    nb.set({"cells": [cell]})
    factory = live_outputs_factory(nb)
    assert factory is not None, "jupyter_ydoc no longer has YNotebook._create_youtputs"
    nb.ycells[0]["outputs"].extend(factory([{"output_type": "stream", "name": "stdout", "text": "hi\n"}]))
    (output,) = nb.get()["cells"][0]["outputs"]
    assert output["output_type"] == "stream" and "".join(output["text"]) == "hi\n"


async def test_a_kernel_whose_start_was_cancelled_can_be_shut_down_after_settling(tmp_path: Path) -> None:
    """jupyter_client leaves ``ready`` pending when a start is cancelled, and ``shutdown_all`` then raises
    InvalidStateError (seen at server stop in CI). Cancelling a start at exactly that point is a race, so
    a real kernel is started and its ``ready`` put back into that state (a fresh pending future, as
    ``in_pending_state`` leaves it); a start still running is never touched."""
    import asyncio

    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

    from jupyter_agent_tools.compat import settle_abandoned_start

    km = AsyncMappingKernelManager(root_dir=str(tmp_path), connection_dir=str(tmp_path))
    kernel_id = await km.start_kernel()
    kernel = km.get_kernel(kernel_id)
    try:
        assert not settle_abandoned_start(km, kernel_id)  # started: nothing to settle
        kernel._ready = asyncio.get_running_loop().create_future()
        running = asyncio.get_running_loop().create_future()
        km._pending_kernels[kernel_id] = running  # a start still running: left alone
        assert not settle_abandoned_start(km, kernel_id) and not kernel.ready.done()
        running.cancel()
        assert settle_abandoned_start(km, kernel_id) and kernel.ready.cancelled()
        km._pending_kernels.pop(kernel_id, None)
        await km.shutdown_all()  # raised InvalidStateError before the ready future was settled
        assert kernel_id not in km
    finally:
        if kernel_id in km:
            kernel._ready = None
            await km.shutdown_kernel(kernel_id, now=True)


def test_session_replay_memory_refuses_what_it_remembered() -> None:
    """``remember_signature`` feeds the same memory ``Session.deserialize`` checks (a replay is refused)."""
    from jupyter_client.session import Session

    from jupyter_agent_tools.compat import remember_signature

    session = Session(key=b"secret")
    frames = session.serialize(session.msg("status", {"execution_state": "idle"}))
    _ident, parts = session.feed_identities([f if isinstance(f, bytes) else f.encode() for f in frames])
    remember_signature(session, parts[0])
    with pytest.raises(ValueError, match="Duplicate Signature"):
        session.deserialize(parts)


def test_prometheus_registry_finds_a_registered_metric_by_name() -> None:
    from prometheus_client import CollectorRegistry, Counter

    from jupyter_agent_tools.compat import registered_metric

    registry = CollectorRegistry()
    counter = Counter("agent_compat_probe", "probe", registry=registry)
    assert registered_metric(registry, "agent_compat_probe") is counter
    assert registered_metric(registry, "agent_compat_absent") is None


def test_event_logger_listener_tables_are_keyed_by_schema_id() -> None:
    from jupyter_events import EventLogger

    from jupyter_agent_tools.audit.events import schema_files
    from jupyter_agent_tools.compat import event_listeners

    logger = EventLogger()
    path = next(iter(schema_files()))
    logger.register_event_schema(path)
    schema_id = next(iter(logger.schemas.schema_ids))
    modified, unmodified = event_listeners(logger)
    assert isinstance(modified, dict) and isinstance(unmodified, dict)
    assert not modified.get(schema_id) and not unmodified.get(schema_id)

    async def listener(logger: object, schema_id: str, data: dict) -> None:
        return None

    logger.add_listener(schema_id=schema_id, listener=listener)
    assert any(table.get(schema_id) for table in event_listeners(logger))


def test_a_control_socket_left_without_a_peer_is_replaced_before_the_shutdown_request() -> None:
    """A control socket with no peer to send to, which libzmq makes wait on every send. In a server it
    is one whose reconnect failed its handshake (the dead kernel's port taken by a socket of another
    kind: a real PUSH squatter does it, but not on every run); here, deterministically, a real socket
    that only counts completed connections (``ZMQ_IMMEDIATE``) toward a port nobody listens on.
    Unguarded, jupyter_client's shutdown request would wait there forever (here 1 s, then zmq.Again, so
    the test fails rather than hangs); guarded, a fresh socket queues it."""
    import zmq
    from jupyter_client.manager import KernelManager

    from jupyter_agent_tools.compat import guard_control_sockets
    from jupyter_agent_tools.testing.server import free_port

    context = zmq.Context()
    km = KernelManager(context=context, control_port=free_port(), ip="127.0.0.1")
    stuck = context.socket(zmq.DEALER)
    stuck.linger, stuck.immediate, stuck.sndtimeo = 0, 1, 1000
    stuck.connect(km._make_url("control"))
    km._control_socket = stuck
    try:
        assert not stuck.get(zmq.EVENTS) & zmq.POLLOUT  # no peer: a send would wait
        guard_control_sockets()
        guard_control_sockets()  # once per process, however often the extension loads
        km._connect_control_socket()  # what _async_request_shutdown does before its send
        km.session.send(km._control_socket, km.session.msg("shutdown_request", {"restart": False}))
        assert km._control_socket is not stuck and stuck.closed
    finally:
        km._close_control_socket()
        stuck.close()
        context.destroy(linger=0)


def test_a_handlers_token_is_hidden_when_its_identity_provider_says_so() -> None:
    """``JupyterHandler.token`` is the property ``page.html``'s ``data-jupyter-api-token`` comes from
    (through ``template_namespace``); guarded, it is None for a handler the provider hides it from."""
    import inspect
    from types import SimpleNamespace

    from jupyter_server.base.handlers import JupyterHandler

    from jupyter_agent_tools.compat import guard_page_token

    guard_page_token()
    guard_page_token()  # once per process
    hidden: set[int] = set()
    provider = SimpleNamespace(token="server-token", hides_token_from=lambda h: id(h) in hidden)
    person = SimpleNamespace(settings={"identity_provider": provider}, identity_provider=provider)
    agent = SimpleNamespace(settings={"identity_provider": provider}, identity_provider=provider)
    hidden.add(id(agent))
    token = JupyterHandler.token.fget
    assert token(person) == "server-token" and token(agent) is None
    plain = SimpleNamespace(token="t")  # a provider that hides nothing (jupyter_server's own)
    assert token(SimpleNamespace(settings={"identity_provider": plain}, identity_provider=plain)) == "t"
    assert "token=self.token" in inspect.getsource(JupyterHandler.template_namespace.fget)


def test_contents_directory_models_are_finished_through_finish_model() -> None:
    """``ContentsHandler.get`` answers through ``_finish_model`` (what ``guard_contents_listings`` wraps
    to leave entries out of an agent's listings); guarded once however often it is asked."""
    import inspect

    from jupyter_server.services.contents.handlers import ContentsHandler

    from jupyter_agent_tools.compat import guard_contents_listings

    assert "self._finish_model(model" in inspect.getsource(ContentsHandler.get)
    guard_contents_listings()
    guarded = ContentsHandler._finish_model
    guard_contents_listings()
    assert ContentsHandler._finish_model is guarded and guarded.guarded_by_agent_tools


async def test_a_muted_websocket_drops_what_it_receives_before_the_close_handshake() -> None:
    """Tornado hands each message to the handler's ``on_message`` looked up per message, and keeps doing
    so after ``close()`` until the client answers: ``mute_websocket`` stops it at once."""
    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port
    from tornado.web import Application
    from tornado.websocket import WebSocketHandler, websocket_connect

    from jupyter_agent_tools.compat import mute_websocket, websocket_muted

    received: list[str] = []

    class Echo(WebSocketHandler):
        def on_message(self, message: str | bytes) -> None:
            received.append(str(message))
            if message == "mute":
                mute_websocket(self)
                assert websocket_muted(self)

    sock, port = bind_unused_port()
    server = HTTPServer(Application([("/ws", Echo)]))
    server.add_sockets([sock])
    try:
        ws = await websocket_connect(f"ws://127.0.0.1:{port}/ws")
        for message in ("one", "mute", "two", "three"):
            await ws.write_message(message)
        await asyncio.sleep(0.3)
        assert received == ["one", "mute"]
        ws.close()
    finally:
        server.stop()
