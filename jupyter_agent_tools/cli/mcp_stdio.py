"""``jupyter agent mcp``: an MCP server on stdio that relays every message to the Jupyter server's MCP
endpoint (``/api/agent/mcp``, Streamable HTTP), for clients that only start local processes.

A thin JSON-RPC relay, not a second MCP server: each line read from stdin is POSTed as it is, with the
headers its protocol era needs (a legacy session's ``Mcp-Session-Id`` and ``MCP-Protocol-Version``; a
2026-07-28 request's ``MCP-Protocol-Version``, ``Mcp-Method`` and ``Mcp-Name``, mirrored from its body), and
each message of the answer (one JSON object, or an SSE stream of progress notifications then the response)
is written to stdout on a line of its own. ``notifications/cancelled`` is forwarded in a legacy session
and closes the call's HTTP answer in both eras (the server then interrupts the kernel). stdout carries
protocol messages only: a failure (no server, a refused token) is the request's JSON-RPC error and a line
on stderr.

Memory is bounded: at most :data:`MAX_IN_FLIGHT` requests at once, :data:`OUT_QUEUE` messages waiting for
a slow stdout reader (the HTTP answers wait meanwhile), stdin lines of at most :data:`MAX_LINE_BYTES` and
answers (an SSE event, a JSON body) of at most :data:`MAX_MESSAGE_BYTES`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import signal
import sys
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import httpx

from ..mcp.jsonrpc import INVALID_REQUEST, PARSE_ERROR, RequestId, error_message, is_request_id
from .discovery import ServerInfo, ServerNotFound, find_server

ENDPOINT = "api/agent/mcp"
ACCEPT = "application/json, text/event-stream"
PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"  # a 2026-07-28 request's _meta
NAMED_METHODS = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}  # -> Mcp-Name
RELAY_ERROR = -32000  # JSON-RPC's implementation-defined server error: what the relay itself answers
MAX_IN_FLIGHT = 64  # requests relayed at once; past it a request is answered with an error at once
OUT_QUEUE = 16  # messages waiting for stdout; an answer's stream waits (and so the server) when full
MAX_LINE_BYTES = 16 * 1024 * 1024  # one stdin line (the server takes 10 MiB bodies by default)
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # one SSE event or JSON answer of the server (images make them large)
TOO_LONG = b"\0"  # what the stdin thread hands over for a line longer than MAX_LINE_BYTES
CANCEL_POST_TIMEOUT = 10.0  # seconds for a legacy notifications/cancelled's POST before the call is closed
CLOSE_TIMEOUT = 2.0  # seconds for the session's DELETE and for stdout's last writes at shutdown
PREFIX = "jupyter agent mcp: "


class _Refused(Exception):
    """An HTTP answer that is no JSON-RPC message (a refused token, a proxy's page); the text says so."""

    def __init__(self, status: int | None, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class _Flight:
    task: asyncio.Task[None]
    modern: bool
    cancelled: bool = False  # by the client: its answer is not wanted


def modern_version(body: Any) -> str | None:
    """A 2026-07-28 request's protocol version (from ``params._meta``), else None (the legacy era)."""
    if not isinstance(body, dict) or body.get("method") == "initialize":
        return None
    params = body.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(meta, dict) or PROTOCOL_VERSION_KEY not in meta:
        return None
    version = meta[PROTOCOL_VERSION_KEY]
    return version if isinstance(version, str) else ""


def _header_safe(value: str) -> bool:
    return value.isascii() and value.isprintable() and value == value.strip()


def encode_header_value(value: str) -> str:
    """A value as an HTTP header carries it: as is, or ``=?base64?...?=`` (UTF-8; 2026-07-28)."""
    import base64

    if _header_safe(value) and not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    return f"=?base64?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


def encode_line(message: Any) -> bytes:
    """One message as one line of stdout (JSON never holds a raw newline)."""
    try:
        return (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate the server escaped: keep it escaped
        return (json.dumps(message, separators=(",", ":")) + "\n").encode("ascii")


async def sse_messages(chunks: AsyncIterator[bytes], limit: int = MAX_MESSAGE_BYTES) -> AsyncIterator[Any]:
    """The JSON messages of an SSE stream's ``message`` events (comments and other events skipped);
    :class:`_Refused` for an event or a line longer than ``limit`` bytes, or data that is not JSON."""
    buffer = bytearray()
    data: list[bytes] = []
    size = 0
    event = ""
    async for chunk in chunks:
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end]).rstrip(b"\r")
            del buffer[: end + 1]
            if not line:  # the end of an event
                if data and event in ("", "message"):
                    yield _decode(b"\n".join(data))
                data, size, event = [], 0, ""
                continue
            name, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if name == b"data":
                data.append(value)
                size += len(value)
                if size > limit:
                    raise _Refused(None, f"the server sent an event of more than {limit} bytes")
            elif name == b"event":
                event = value.decode("utf-8", "replace")
        if len(buffer) > limit:
            raise _Refused(None, f"the server sent a line of more than {limit} bytes")


def _decode(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise _Refused(None, "the server sent an event that is not JSON") from None


class Output:
    """stdout, written by a thread of its own: the event loop never blocks on a slow reader, and at most
    :data:`OUT_QUEUE` messages wait (a producer waits for room)."""

    def __init__(self, stream: BinaryIO, on_closed: Callable[[], None]):
        self.stream = stream
        self.room = asyncio.Semaphore(OUT_QUEUE)
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._on_closed = on_closed
        self._thread = threading.Thread(target=self._write, name="mcp-stdout", daemon=True)
        self._thread.start()

    async def send(self, message: Any) -> None:
        await self.room.acquire()
        if self.closed:
            self.room.release()
            return
        self.lines.put(encode_line(message))

    def _write(self) -> None:
        while (line := self.lines.get()) is not None:
            try:
                if not self.closed:
                    self.stream.write(line)
                    self.stream.flush()
            except (OSError, ValueError):  # the client closed its end
                self.closed = True
                self._loop.call_soon_threadsafe(self._on_closed)
            self._loop.call_soon_threadsafe(self.room.release)

    async def close(self) -> None:
        """Write what is waiting (bounded by :data:`CLOSE_TIMEOUT`), then stop the thread."""
        self.lines.put(None)
        await asyncio.to_thread(self._thread.join, CLOSE_TIMEOUT)


def _read_stdin(
    stream: BinaryIO, loop: asyncio.AbstractEventLoop, lines: asyncio.Queue[bytes | None]
) -> None:
    """Read lines into ``lines`` until EOF, then None; a line longer than MAX_LINE_BYTES as
    :data:`TOO_LONG` (skipped to its end). Runs in a thread: it works for pipes, files and terminals
    alike, on every platform."""
    try:
        while line := stream.readline(MAX_LINE_BYTES + 1):
            if len(line) > MAX_LINE_BYTES:
                while not line.endswith(b"\n") and (line := stream.readline(1024 * 1024)):
                    pass  # the rest of a line that is too long: skipped
                line = TOO_LONG
            asyncio.run_coroutine_threadsafe(lines.put(line), loop).result()
    except (OSError, ValueError, RuntimeError):
        pass
    with contextlib.suppress(RuntimeError):  # (the loop already closed)
        asyncio.run_coroutine_threadsafe(lines.put(None), loop).result()


@dataclass
class Relay:
    """The relay's state: the server (found lazily, found again after it went away), the legacy session,
    and the requests in flight."""

    find: Callable[[], ServerInfo]
    out: Output
    say: Callable[[str], None]  # a line on stderr
    http: httpx.AsyncClient
    server: ServerInfo | None = None
    session_id: str | None = None
    version: str | None = None  # the legacy session's negotiated protocol version
    init_body: dict[str, Any] | None = None  # the client's initialize, sent again for a new session
    flights: dict[RequestId, _Flight] = field(default_factory=dict)
    others: set[asyncio.Task[None]] = field(default_factory=set)
    reopen_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reopened: int = 0
    getting: asyncio.Task[None] | None = None  # the GET stream of server messages, if the server has one

    # -- stdin ------------------------------------------------------------------------------------------

    async def take(self, line: bytes) -> None:
        """Handle one line of stdin: start relaying it (requests run concurrently)."""
        if line is TOO_LONG:
            message = f"Invalid Request: a message of more than {MAX_LINE_BYTES} bytes (not relayed)"
            await self.out.send(error_message(None, INVALID_REQUEST, message))
            return
        if not line.strip():
            return
        try:
            body = json.loads(line)
        except ValueError as e:
            await self.out.send(error_message(None, PARSE_ERROR, f"Parse error: {e}"))
            return
        if isinstance(body, dict) and body.get("method") == "notifications/cancelled" and "id" not in body:
            self._spawn(self._cancel(body, line))
            return
        rid = body.get("id") if isinstance(body, dict) and "method" in body else None
        if not is_request_id(rid):
            self._spawn(self._relay(body, line, None))  # a notification, a response, a batch: no flight
            return
        assert rid is not None
        if rid in self.flights or len(self.flights) >= MAX_IN_FLIGHT:
            why = (
                f"id {rid!r} is already in use by a request in flight"
                if rid in self.flights
                else f"{MAX_IN_FLIGHT} requests are in flight already (jupyter agent mcp relays at most "
                f"{MAX_IN_FLIGHT} at once); send it again once one is answered"
            )
            await self.out.send(error_message(rid, INVALID_REQUEST, f"Invalid Request: {why}"))
            return
        flight = _Flight(
            asyncio.ensure_future(self._relay(body, line, rid)), modern_version(body) is not None
        )
        self.flights[rid] = flight
        flight.task.add_done_callback(lambda _: self._landed(rid, flight))

    def _landed(self, rid: RequestId, flight: _Flight) -> None:
        if self.flights.get(rid) is flight:
            del self.flights[rid]

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.others.add(task)
        task.add_done_callback(self.others.discard)

    async def _cancel(self, body: dict[str, Any], line: bytes) -> None:
        """``notifications/cancelled``: POST it in a legacy session (the server ends the call without a
        response), and close the call's answer (what cancels at 2026-07-28, and a call not yet arrived)."""
        params = body.get("params")
        rid = params.get("requestId") if isinstance(params, dict) else None
        flight = self.flights.get(rid) if isinstance(rid, (str, int)) else None
        if flight is not None:
            flight.cancelled = True
        if (flight is None and self.session_id is not None) or (flight is not None and not flight.modern):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._relay(body, line, None), CANCEL_POST_TIMEOUT)
        if flight is not None:
            flight.task.cancel()

    # -- one message ------------------------------------------------------------------------------------

    async def _relay(self, body: Any, raw: bytes, rid: RequestId | None) -> None:
        """POST ``raw`` (``body`` as read); write each message of the answer to stdout. A failure becomes
        the request's JSON-RPC error (and a line on stderr); a notification's only a line on stderr."""
        try:
            answered = False
            async with contextlib.aclosing(self._exchange(body, raw)) as messages:
                async for message in messages:
                    await self._out(message, rid)
                    answered = answered or _answers(message, rid)
            flight = self.flights.get(rid) if rid is not None else None
            if rid is not None and not answered and not (flight is not None and flight.cancelled):
                raise _Refused(None, "the server ended its answer without a response")
        except _Refused as e:
            self.say(e.message)
            if rid is not None:
                data = {"status": e.status} if e.status is not None else None
                await self.out.send(error_message(rid, RELAY_ERROR, e.message, data))

    async def _out(self, message: Any, rid: RequestId | None) -> None:
        if rid is not None and isinstance(message, dict) and message.get("id") is None and "error" in message:
            message = {**message, "id": rid}  # an error the server could not tie to the request
        await self.out.send(message)

    async def _exchange(self, body: Any, raw: bytes) -> AsyncGenerator[Any, None]:
        """The messages answering ``body``: a legacy session reopened once when the server forgot it, a
        connection refused tried once more on the server found again (it may have restarted elsewhere)."""
        initialize = isinstance(body, dict) and body.get("method") == "initialize"
        if initialize and isinstance(body.get("params"), dict):
            self.init_body = body
        for attempt in (0, 1):
            server = self._server()
            legacy = not initialize and modern_version(body) is None
            if legacy and self.session_id is None and self.init_body is not None:
                await self._reopen(None)
            sent_session = self.session_id if legacy else None
            try:
                async with self._post(server, raw, self._headers(server, body, legacy)) as response:
                    if response.status_code == 404 and sent_session is not None and attempt == 0:
                        await response.aclose()
                        await self._reopen(sent_session)
                        continue
                    async for message in self._messages(response):
                        if initialize:
                            self._opened(response, message)
                        yield message
                return
            except httpx.ConnectError as e:
                self.server, self.session_id = None, None  # found again next time; a session is per server
                if attempt == 0 and self._server_moved(server):
                    continue
                raise _Refused(
                    None,
                    f"cannot reach the Jupyter server at {server.url} ({e}): is it running? (found via "
                    f"{server.source}; --url or JUPYTER_AGENT_URL names another)",
                ) from None
            except httpx.HTTPError as e:
                raise _Refused(
                    None, f"the connection to the Jupyter server at {server.url} failed: {e}"
                ) from None

    def _server(self) -> ServerInfo:
        if self.server is None:
            try:
                self.server = self.find()
            except ServerNotFound as e:
                raise _Refused(None, str(e)) from None
            self.say(f"relaying to {self.server.url.rstrip('/')}/{ENDPOINT} (found via {self.server.source})")
        return self.server

    def _server_moved(self, old: ServerInfo) -> bool:
        with contextlib.suppress(_Refused):
            return self._server().url != old.url
        return False

    def _headers(self, server: ServerInfo, body: Any, legacy: bool) -> dict[str, str]:
        headers = {"Accept": ACCEPT, "Content-Type": "application/json"}
        if server.token:
            headers["Authorization"] = f"token {server.token}"
        version = modern_version(body)
        if version is not None:  # mirrored from the body, as the 2026-07-28 transport requires
            method = body.get("method")
            for name, value in (("MCP-Protocol-Version", version), ("Mcp-Method", method)):
                if isinstance(value, str) and value and _header_safe(value):
                    headers[name] = value
            key = NAMED_METHODS.get(method) if isinstance(method, str) else None
            named = body["params"].get(key) if key is not None else None
            if isinstance(named, str):
                headers["Mcp-Name"] = encode_header_value(named)
        elif legacy:
            if self.session_id is not None:
                headers["Mcp-Session-Id"] = self.session_id
            if self.version is not None:
                headers["MCP-Protocol-Version"] = self.version
        return headers

    @contextlib.asynccontextmanager
    async def _post(
        self, server: ServerInfo, content: bytes, headers: dict[str, str]
    ) -> AsyncIterator[httpx.Response]:
        async with self.http.stream("POST", endpoint(server), content=content, headers=headers) as response:
            yield response

    async def _messages(self, response: httpx.Response) -> AsyncIterator[Any]:
        """The JSON-RPC messages of an answer; :class:`_Refused` for one that holds none."""
        if response.status_code in (202, 204):
            return
        kind = response.headers.get("content-type", "")
        if response.status_code == 200 and kind.startswith("text/event-stream"):
            async for message in sse_messages(response.aiter_bytes()):
                yield message
            return
        content = await _read(response)
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = None
        if isinstance(parsed, list) or (isinstance(parsed, dict) and parsed.get("jsonrpc") == "2.0"):
            yield parsed
            return
        raise _Refused(response.status_code, self._why(response.status_code, parsed, content))

    def _why(self, status: int, parsed: Any, content: bytes) -> str:
        said = parsed.get("message") if isinstance(parsed, dict) else None
        said = str(said or content[:200].decode("utf-8", "replace").strip() or "no message")
        url = self.server.url if self.server is not None else "the server"
        if status in (401, 403):
            return (
                f"the Jupyter server at {url} refused the token (HTTP {status}: {said}); check --token or "
                "JUPYTER_AGENT_TOKEN (without them: the token the running server recorded)"
            )
        return f"the Jupyter server at {url} answered HTTP {status} without a JSON-RPC message: {said}"

    def _opened(self, response: httpx.Response, message: Any) -> None:
        """A legacy session the server opened: keep its id and version; listen on its GET stream."""
        session = response.headers.get("mcp-session-id")
        result = message.get("result") if isinstance(message, dict) else None
        if session is None or not isinstance(result, dict):
            return
        self.session_id = session
        version = result.get("protocolVersion")
        self.version = version if isinstance(version, str) and _header_safe(version) else None
        if self.getting is not None:
            self.getting.cancel()
        self.getting = asyncio.ensure_future(self._listen(session))

    async def _reopen(self, stale: str | None) -> None:
        """Open a new legacy session with the client's own initialize (the server restarted, or the
        session was ended or expired): the client never sees it; later requests use it."""
        async with self.reopen_lock:
            if self.session_id != stale or self.init_body is None:
                return  # another request reopened it meanwhile
            self.reopened += 1
            body = {**self.init_body, "id": f"jupyter-agent-mcp-reopen-{self.reopened}"}
            server = self._server()
            try:
                async with self._post(server, _encode(body), self._headers(server, body, False)) as response:
                    async for message in self._messages(response):
                        self._opened(response, message)
                if self.session_id is None or self.session_id == stale:
                    raise _Refused(None, "the server did not open a new MCP session")
                initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                headers = self._headers(server, initialized, True)
                async with self._post(server, _encode(initialized), headers) as done:
                    await done.aread()
            except httpx.HTTPError as e:
                raise _Refused(None, f"cannot open a new MCP session at {server.url}: {e}") from None
            self.say("the MCP session had ended (did the server restart?): opened a new one")

    async def _listen(self, session: str) -> None:
        """Relay what the server sends on the session's GET stream (this server's: the updates of the
        session's resource subscriptions, ``jupyter://focus``); a server without one answers 405, and this
        ends at once."""
        if self.server is None:
            return
        headers = {**self._headers(self.server, None, True), "Accept": "text/event-stream"}
        headers.pop("Content-Type")
        with contextlib.suppress(httpx.HTTPError, _Refused):
            async with self.http.stream("GET", endpoint(self.server), headers=headers) as response:
                kind = response.headers.get("content-type", "")
                if response.status_code != 200 or not kind.startswith("text/event-stream"):
                    return
                async for message in sse_messages(response.aiter_bytes()):
                    if self.session_id != session:
                        return
                    await self.out.send(message)

    # -- shutdown ---------------------------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait for every request and notification in flight to be answered (stdin ended)."""
        while self.flights or self.others:
            pending = [flight.task for flight in self.flights.values()] + list(self.others)
            await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        """Close every call's answer (the server cancels them and interrupts their kernels), end the
        legacy session (DELETE), close the connections."""
        running = [flight.task for flight in self.flights.values()] + list(self.others)
        if self.getting is not None:
            running.append(self.getting)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        if self.session_id is not None and self.server is not None:
            headers = self._headers(self.server, None, True)
            with contextlib.suppress(httpx.HTTPError):
                await self.http.delete(endpoint(self.server), headers=headers, timeout=CLOSE_TIMEOUT)
        await self.http.aclose()


def _answers(message: Any, rid: RequestId | None) -> bool:
    """Whether ``message`` is the response to request ``rid``."""
    if rid is None or not isinstance(message, dict) or ("result" not in message and "error" not in message):
        return False
    return message.get("id") in (rid, None)


def _encode(message: Any) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode("utf-8")


async def _read(response: httpx.Response) -> bytes:
    content = bytearray()
    async for chunk in response.aiter_bytes():
        content += chunk
        if len(content) > MAX_MESSAGE_BYTES:
            raise _Refused(
                response.status_code, f"the server's answer is larger than {MAX_MESSAGE_BYTES} bytes"
            )
    return bytes(content)


def endpoint(server: ServerInfo) -> str:
    return server.url.rstrip("/") + "/" + ENDPOINT


async def serve(
    find: Callable[[], ServerInfo],
    stdin: BinaryIO,
    stdout: BinaryIO,
    say: Callable[[str], None],
) -> None:
    """Relay stdin to the server and its answers to stdout until stdin ends (then the calls in flight are
    answered first) or a signal or a closed stdout stops it (then they are cancelled)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    out = Output(stdout, stop.set)
    limits = httpx.Limits(max_connections=MAX_IN_FLIGHT + 8, max_keepalive_connections=8)
    timeout = httpx.Timeout(30.0, read=None)  # a call streams as long as it runs
    relay = Relay(find, out, say, httpx.AsyncClient(timeout=timeout, limits=limits))
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # (Windows, a thread)
            loop.add_signal_handler(sig, stop.set)
    try:
        relay._server()  # say early which server it is (or that none runs yet: looked for again later)
    except _Refused as e:
        say(f"{e.message} (looked for again at each request)")
    lines: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=1)
    threading.Thread(target=_read_stdin, args=(stdin, loop, lines), name="mcp-stdin", daemon=True).start()
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while True:
            got = asyncio.ensure_future(lines.get())
            await asyncio.wait({got, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not got.done():
                got.cancel()
                break
            line = got.result()
            if line is None:  # stdin ended: answer what is in flight, unless stopped meanwhile
                drained = asyncio.ensure_future(relay.drain())
                await asyncio.wait({drained, stopped}, return_when=asyncio.FIRST_COMPLETED)
                drained.cancel()
                break
            await relay.take(line)
    finally:
        stopped.cancel()
        await relay.close()
        await out.close()


def main(url: str | None, token: str | None) -> int:
    """Run the relay until stdin ends; 0, or 1 when it could not run at all."""

    def say(text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(PREFIX + text + "\n")
            sys.stderr.flush()

    def find() -> ServerInfo:
        return find_server(url, token, note=say)

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    # Nothing else may write to stdout (a stray print would corrupt the protocol): point it at stderr.
    sys.stdout = sys.stderr
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(find, stdin, stdout, say))
    return 0
