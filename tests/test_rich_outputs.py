"""Rich outputs of real kernels: HTML-only objects shown as text, big HTML converted off the event loop
and cut, big displays and errors kept out of the answer (saved as artifacts). Real server, real kernels.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import threading
import time
from typing import Any

import pytest
from contract import NDJSON, Contract
from test_eval import stream

from jupyter_agent_tools.api_document import openapi_document
from jupyter_agent_tools.execution import messages
from jupyter_agent_tools.execution.cells import CellExecutor
from jupyter_agent_tools.execution.messages import OutputLimits, RichOutput, bounded_html_to_text

pytestmark = pytest.mark.timeout(240)
MB = 1024 * 1024
CONTRACT = Contract(openapi_document())
EVAL = "/api/agent/eval"


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}}}


async def test_objects_with_only_html_show_their_html_as_text(evaluate):
    result = await evaluate(
        "import pandas as pd\n"
        "class T:\n"
        "    def _repr_html_(self):\n"
        "        return '<h3>Report</h3><p>total: <b>42</b></p>'\n"
        "df = pd.DataFrame({'name': ['ada', 'bob'], 'score': [3, 4]})\n"
        "T()",
        "df.style",
        "df",
    )
    html_only, styler, frame = (cell["output"] for cell in result["cells"])
    assert html_only == "### Report\n\ntotal: **42**\n"
    assert "at 0x" not in styler
    rows = [line.replace(" ", "") for line in styler.splitlines()]
    assert "|name|score|" in rows[0] and "|ada|3|" in "".join(rows) and "|bob|4|" in "".join(rows)
    assert frame.splitlines() == ["  name  score", "0  ada      3", "1  bob      4"]  # plain text stays


async def test_big_html_is_converted_off_the_event_loop_cut_and_saved(evaluate, jp_fetch, monkeypatch):
    converted_on: list[int] = []  # the threads the server converted HTML in

    def converting_in(html: str, rich: RichOutput) -> str:
        converted_on.append(threading.get_ident())
        return bounded_html_to_text(html, rich)

    monkeypatch.setattr(messages, "bounded_html_to_text", converting_in)
    make_html = (
        "rows = ''.join(f'<tr><td>{i}</td><td>row {i}</td></tr>' for i in range(150_000))\n"
        "html = '<table><tr><th>n</th><th>name</th></tr>' + rows + '</table>'\n"
    )
    scope: dict[str, Any] = {}
    exec(make_html, scope)
    size = len(scope["html"])
    code = f"from IPython.display import HTML, display\n{make_html}display(HTML(html))"
    lags: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:  # how long the server's event loop is kept from running other work
        while not done.is_set():
            started = time.monotonic()
            await asyncio.sleep(0.02)
            lags.append(time.monotonic() - started - 0.02)

    prober = asyncio.ensure_future(probe())
    try:
        result = await evaluate(code, timeout=120)
    finally:
        done.set()
        await prober
    cell = result["cells"][0]
    assert size > 5_000_000
    # The baseline, measured here under the same load: how long the server's conversion of this HTML
    # takes. Done on the event loop, it would stall the loop at least that long.
    started = time.monotonic()
    traits = CellExecutor.class_traits()
    limits = OutputLimits(
        display_bytes=traits["max_display_bytes"].default_value,
        html_convert_bytes=traits["max_html_convert_bytes"].default_value,
    )
    bounded_html_to_text(scope["html"], RichOutput(limits))
    converting = time.monotonic() - started
    # Off the loop: the conversion ran in another thread than the server's event loop, and the longest
    # stall of the loop is a small part of it (0.14-0.15 measured on a loaded machine; on the loop,
    # 0.94-1.10; a machine loaded past its cores stalls the loop for its own reasons, so the bound is loose).
    assert converted_on and threading.get_ident() not in converted_on, converted_on
    blocked = max(lags)
    assert blocked < converting * 3 + 1, (
        f"the loop was blocked {blocked:.2f} s (converting: {converting:.2f} s)"
    )
    text = cell["output"]
    assert re.search(r"^\| \d+ \| row \d+ \|$", text, re.M)  # table rows (their tail: max_output_bytes)
    assert "row 149999" not in text and "<td>" not in text
    notice = text.rstrip("\n").rsplit("\n", 1)[1]
    assert notice.startswith(f"[HTML output of {size / MB:.1f}MB cut: converted its first ")
    artifact_id = notice.rsplit("artifact://", 1)[1].rstrip("]")
    full = await jp_fetch("api", "agent", "artifacts", artifact_id)
    assert len(full.body) == size and full.body.endswith(b"<td>row 149999</td></tr></table>")
    print(
        f"\nlongest event-loop stall during a {size / MB:.1f} MB HTML display: {max(lags) * 1000:.0f} ms "
        f"(converting it takes {converting * 1000:.0f} ms here)"
    )


PNG_CODE = """
import hashlib, struct, zlib, os
from IPython.display import Image, JSON, display

def png(width, height, raw):
    def chunk(kind, data):
        return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
    rows = b''.join(b'\\x00' + raw[y * width * 3:(y + 1) * width * 3] for y in range(height))
    header = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)
    body = chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(rows, 0)) + chunk(b'IEND', b'')
    return b'\\x89PNG\\r\\n\\x1a\\n' + body

small = png(2, 2, os.urandom(12))
big = png(4096, {height}, os.urandom(4096 * {height} * 3))
print(len(big), hashlib.sha256(big).hexdigest())
display(Image(data=small, format='png'))
display(Image(data=big, format='png'))
display(JSON({{'values': list(range(400_000))}}))
"""


async def test_big_displays_become_placeholders_with_their_data_in_artifacts(api, jp_fetch):
    code = PNG_CODE.format(height=4096)  # a 48 MiB PNG, 64 MiB as base64
    body = {"cells": [{"code": code}], "session": "images", "timeout": 120}
    response = await jp_fetch(
        "api", "agent", "eval", method="POST", body=json.dumps(body), request_timeout=120
    )
    assert len(response.body) < 2 * MB + 64 * 1024  # the answer stays within max_display_bytes, about
    result = json.loads(response.body)
    CONTRACT.assert_response("POST", EVAL, 200, result)
    cell = result["cells"][0]
    size, digest = cell["output"].split()
    small, big, values = cell["displays"]
    assert small["mime"] == "image/png" and base64.b64decode(small["data"]).startswith(b"\x89PNG")
    assert big == {
        "type": "image",
        "mime": "image/png",
        "bytes": big["bytes"],
        "omitted": True,
        "artifact_id": big["artifact_id"],
    }
    assert big["bytes"] >= 4 * int(size) // 3
    saved = await jp_fetch("api", "agent", "artifacts", big["artifact_id"], request_timeout=120)
    assert len(saved.body) == big["bytes"]
    decoded = base64.b64decode(saved.body)
    assert len(decoded) == int(size) and hashlib.sha256(decoded).hexdigest() == digest
    assert values["type"] == "json" and values["omitted"] is True
    saved = await jp_fetch("api", "agent", "artifacts", values["artifact_id"])
    assert len(saved.body) == values["bytes"]
    assert json.loads(saved.body) == {"values": list(range(400_000))}


async def test_stream_display_events_carry_the_placeholder(jp_fetch):
    code = PNG_CODE.format(height=1024)  # 12 MiB
    _, events = await stream(jp_fetch, {"cells": [{"code": code}], "session": "streamed"}, timeout=120)
    for event in events:
        CONTRACT.assert_response("POST", EVAL, 200, event, NDJSON)
    displays = [e["display"] for e in events if e["type"] == "display"]
    assert [d.get("omitted", False) for d in displays] == [False, True, True]
    assert displays == events[-1]["result"]["cells"][0]["displays"]


async def test_huge_exception_message_keeps_the_answer_bounded(api, jp_fetch):
    body = {"cells": [{"code": "raise ValueError('v' * 20_000_000)"}], "session": "raises"}
    response = await jp_fetch(
        "api", "agent", "eval", method="POST", body=json.dumps(body), raise_error=False, request_timeout=120
    )
    assert len(response.body) < 512 * 1024
    result = json.loads(response.body)
    CONTRACT.assert_response("POST", EVAL, 200, result)
    cell = result["cells"][0]
    assert cell["status"] == "error" and cell["error"]["ename"] == "ValueError"
    assert len(cell["error"]["evalue"]) < 60 * 1024 and "more characters]" in cell["error"]["evalue"]
    assert cell["truncated"] is True
    full = await jp_fetch("api", "agent", "artifacts", cell["artifact_id"], request_timeout=120)
    assert b"ValueError: " + b"v" * 20_000_000 in full.body
