"""The iopub intake loses nothing and stays bounded in memory while the server is slower than the kernel.

The server shares the test's event loop: the test blocks it while a real kernel floods its output, as a
busy server would, and watches the process's memory from a thread meanwhile.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from typing import Any

import psutil
import pytest
import zmq

from jupyter_agent_tools.eval.connection import drain
from jupyter_agent_tools.eval.iopub import IopubReader, MessageQueue
from jupyter_agent_tools.eval.service import OUTPUT_MAY_BE_INCOMPLETE

pytestmark = pytest.mark.timeout(240)

MIB = 1024 * 1024
BUDGET = 1 * MIB
LINES = 12000
LINE = 8000  # bytes per printed line, then a newline: 96 MB in 12000 flushed messages (the test client
# reads at most 100 MB)
# jupyter_server's activity watcher subscribes to the same output with ZMQ's default high-water mark:
# while the loop is blocked it holds up to 1000 of these messages (measured: ~20-27 MB of growth for the
# server without this intake, which then lost output). Held in memory, the flood alone would add 96 MB.
# Measured with this intake: 25-47 MB (allocator and the server's first work in this process included).
WATCHER = 1000 * LINE * 3
MARGIN = 40 * MIB


@pytest.fixture
def jp_server_config(tmp_path: Any) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "AgentToolsApp": {
            "heartbeat_interval": 0,
            "iopub_buffer_bytes": BUDGET,
            "artifacts_dir": str(tmp_path / "artifacts"),
        },
    }


def printed() -> bytes:
    return b"".join(f"{i:08d}".encode() * (LINE // 8) + b"\n" for i in range(LINES))


class PeakRss:
    """Samples this process's resident memory from a thread (the event loop may be blocked)."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.start


async def test_flood_while_the_server_is_blocked_loses_nothing(evaluate, api, jp_fetch, tmp_path):
    await evaluate("1", session="flood")
    started, go, done = (str(tmp_path / name) for name in ("started", "go", "done"))
    code = (
        "import os, sys, time\n"
        f"open({started!r}, 'w').close()\n"
        f"while not os.path.exists({go!r}):\n    time.sleep(0.01)\n"
        f"for i in range({LINES}):\n"
        f"    sys.stdout.write(f'{{i:08d}}' * {LINE // 8} + '\\n'); sys.stdout.flush()\n"
        f"open({done!r}, 'w').close()\n"
    )
    with PeakRss() as rss:
        call = asyncio.ensure_future(evaluate(code, session="flood", timeout=180))
        while not os.path.exists(started):
            await asyncio.sleep(0.01)
        open(go, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.01)  # the server shares this event loop: it reads nothing meanwhile
        time.sleep(1.0)  # the reply and the idle after the flood are sent too
        assert os.path.exists(done)
        result = await call
    cell = result["cells"][0]
    assert result["timed_out"] is False
    assert cell["status"] == "complete"
    assert cell["total_lines"] == LINES
    assert not result["output"].startswith(OUTPUT_MAY_BE_INCOMPLETE)
    expected = printed()
    artifact = await jp_fetch("api", "agent", "artifacts", cell["artifact_id"])
    assert len(artifact.body) == len(expected)
    assert hashlib.sha256(artifact.body).hexdigest() == hashlib.sha256(expected).hexdigest()
    _, listing = await api("GET", "sessions")
    (entry,) = [s for s in listing["sessions"] if s["name"] == "flood"]
    assert not entry["recoveries"].get("lost_idle")
    # 96 MB arrived while nothing was processed: all but the budget waited in the spool file
    assert rss.growth < WATCHER + BUDGET + MARGIN, f"grew by {rss.growth / MIB:.1f} MiB"
    assert (await evaluate("print('next')", session="flood"))["output"] == "next\n"


async def test_reader_keeps_order_through_its_spool_within_its_budget():
    """Real ZMQ sockets: 3000 messages (one of them bigger than the budget) arrive while nobody takes
    them; they come out in order and whole, memory never held more than the budget plus one message, and
    closing joins the thread and removes the spool file."""
    loop = asyncio.get_running_loop()
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    queue = MessageQueue(lambda frames: {"frames": frames})
    budget = 64 * 1024
    reader = IopubReader(sub, budget, lambda: loop.call_soon_threadsafe(queue.wake))
    queue.reader = reader
    reader.start()
    try:
        while not reader.received:  # the subscription reaches the publisher
            pub.send_multipart([b"probe"])
            await asyncio.sleep(0.01)
        assert drain(queue) >= 1
        sent = [[b"id", f"{i}".encode(), b"x" * (i % 97) * 50] for i in range(3000)]
        sent[1500][2] = b"y" * (3 * budget)  # one message larger than the whole budget: held whole
        for frames in sent:
            pub.send_multipart(frames)
        deadline = time.monotonic() + 30
        while reader.received < 3000 + 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # nobody takes anything meanwhile
        assert reader.spooled_total > 0
        spool_file = reader._spool._file
        assert spool_file is not None and os.fstat(spool_file.fileno()).st_size > budget
        got = [(await asyncio.wait_for(queue.get(), 10))["frames"] for _ in sent]
        assert got == sent
        assert reader.peak_memory_bytes <= budget + 3 * budget + 100
        with pytest.raises(asyncio.QueueEmpty):
            queue.get_nowait()
    finally:
        reader.close()
        pub.close(linger=0)
        context.term()  # would block if the reader's socket were still open
    assert not reader._thread.is_alive()
    assert spool_file.closed
