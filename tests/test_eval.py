"""The eval routes against a real Jupyter server and real ipykernel kernels."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from jupyter_agent_tools.execution.executor import STDIN_NOTICE

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "EvalSessionManager": {"max_sessions": 2},
        "CellExecutor": {"interrupt_grace": 10.0},
    }


async def stream(jp_fetch, body, on_line=None, timeout=60):
    """POST an eval with Accept: application/x-ndjson and collect the events as they arrive."""
    buffer = b""
    events: list[dict[str, Any]] = []

    def on_chunk(chunk: bytes) -> None:
        nonlocal buffer
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            event = json.loads(line)
            events.append(event)
            if on_line:
                on_line(event)

    response = await jp_fetch(
        "api",
        "agent",
        "eval",
        method="POST",
        body=json.dumps(body),
        headers={"Accept": "application/x-ndjson"},
        streaming_callback=on_chunk,
        request_timeout=timeout,
        raise_error=False,
    )
    return response, events


async def test_multi_cell_state_persists(evaluate):
    result = await evaluate("x = 20", "y = x + 1\nprint(y)", "x * 2 + y")
    assert [c["status"] for c in result["cells"]] == ["complete"] * 3
    assert result["cells"][1]["output"] == "21\n"
    assert result["cells"][2]["output"] == "61\n"
    assert result["output"].startswith("[1/3]")
    assert "[3/3]\n61" in result["output"]
    again = await evaluate("print(x)")
    assert again["output"] == "20\n"
    assert again["kernel_id"] == result["kernel_id"]
    assert result["session"] == "default" and result["mode"] == "session"


async def test_kernel_shows_in_kernels_api(evaluate, jp_fetch):
    result = await evaluate("1")
    kernels = json.loads((await jp_fetch("api", "kernels")).body)
    assert result["kernel_id"] in [k["id"] for k in kernels]


async def test_failed_cell_stops_later_cells(evaluate):
    result = await evaluate("a = 1", "1/0", "print('never')")
    assert len(result["cells"]) == 2
    failed = result["cells"][1]
    assert failed["status"] == "error" and failed["exit_code"] == 1
    assert failed["error"]["ename"] == "ZeroDivisionError"
    assert "\x1b" not in "".join(failed["error"]["traceback"])
    assert "ZeroDivisionError" in failed["output"]
    assert result["output"].endswith(
        "Cell 2 failed (exit code 1). Earlier cells succeeded—their state persists. Fix only cell 2."
    )
    assert "never" not in result["output"]


async def test_empty_output_and_display_only(evaluate):
    assert (await evaluate("x = 1"))["output"] == "(no output)"
    result = await evaluate(
        "from IPython.display import display\n"
        "display({'application/x-omp-status': {'phase': 'done'}}, raw=True)"
    )
    assert result["output"] == "(no text output)"
    assert result["cells"][0]["displays"] == [{"type": "status", "event": {"phase": "done"}}]


async def test_rich_displays(evaluate):
    result = await evaluate(
        "from IPython.display import display, JSON, Markdown\n"
        "display(JSON({'a': [1, 2]}))\n"
        "display(Markdown('**bold** text'))\n"
        "import matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3])\nplt.show()\n"
        "from matplotlib_inline.backend_inline import flush_figures\n"
    )
    cell = result["cells"][0]
    kinds = [d["type"] for d in cell["displays"]]
    assert "json" in kinds
    assert {"type": "json", "data": {"a": [1, 2]}} in cell["displays"]
    assert "**bold** text" in cell["output"]


async def test_image_display(evaluate):
    result = await evaluate(
        "import matplotlib.pyplot as plt\n%matplotlib inline\nplt.plot([1, 2, 3])\nplt.show()"
    )
    images = [d for d in result["cells"][0]["displays"] if d["type"] == "image"]
    assert images and images[0]["mime"] == "image/png"
    import base64

    assert base64.b64decode(images[0]["data"]).startswith(b"\x89PNG")


async def test_dataframe_html_becomes_table(evaluate):
    result = await evaluate(
        "import pandas as pd\n"
        "from IPython.display import HTML, display\n"
        "df = pd.DataFrame({'name': ['ada', 'bob'], 'score': [3, 4]})\n"
        "display(HTML(df.to_html()))\n"
        "df"
    )
    output = result["cells"][0]["output"]
    assert "| name" in output and "ada" in output and "<td>" not in output
    assert "IPython.core.display.HTML object" not in output
    assert "name  score" in output  # the DataFrame's own text/plain repr wins over its HTML


async def test_stdin_never_hangs(evaluate):
    """input() fails at once (the call has no stdin): one line says so, the code stops there."""
    result = await evaluate("v = input('name? ')\nprint('got', repr(v))", timeout=20)
    cell = result["cells"][0]
    assert cell["stdin_requested"] is True
    assert cell["exit_code"] == 1 and cell["error"]["ename"] == "StdinNotImplementedError"
    assert cell["output"] == STDIN_NOTICE  # "This call cannot read stdin, so input() failed: ..."
    assert (await evaluate("print('still usable')"))["output"] == "still usable\n"


async def test_timeout_interrupts_and_session_survives(evaluate):
    result = await evaluate("import time\nx = 5\nprint('start', flush=True)\ntime.sleep(60)", timeout=2)
    assert result["timed_out"] is True and result["cancelled"] is True
    cell = result["cells"][0]
    assert cell["status"] == "cancelled"
    assert cell["output"].startswith("start\n")
    assert result["output"].rstrip().endswith("Command timed out after 2 seconds")
    assert (await evaluate("print(x)"))["output"] == "5\n"


async def test_one_timeout_budget_for_the_call(evaluate):
    result = await evaluate("import time; time.sleep(1.5)", "time.sleep(1.5)", "print('no')", timeout=2)
    assert result["timed_out"] is True
    assert [c["status"] for c in result["cells"]] == ["complete", "cancelled"]


async def test_reset_replaces_kernel(evaluate):
    first = await evaluate("secret = 42")
    second = await evaluate("print('secret' in globals())", reset=True)
    assert second["output"] == "False\n"
    assert second["kernel_id"] != first["kernel_id"]


async def agent_kernels(jp_serverapp) -> set[str]:
    """The server's kernels but the warm pool's, once the pool has settled (full, nothing starting) and
    per-call kernels have been shut down (in the background, after the answer)."""
    service = jp_serverapp.web_app.settings["jupyter_agent_tools"].eval_service
    pool = service.pool
    for _ in range(600):
        settled = pool.starting_count == 0 and (pool.ready_count == pool.size or pool.taken == 0)
        if settled and service.sessions.per_call_ending == 0:
            break
        await asyncio.sleep(0.1)
    return set(jp_serverapp.kernel_manager.list_kernel_ids()) - set(pool.kernel_ids)


async def test_per_call_mode_shuts_kernel_down(evaluate, api, jp_serverapp):
    before = await agent_kernels(jp_serverapp)
    result = await evaluate("import os\nprint(os.getpid())", mode="per-call")
    assert result["cells"][0]["status"] == "complete"
    assert result["mode"] == "per-call" and result["session"] is None
    assert await agent_kernels(jp_serverapp) == before
    failing = await evaluate("raise SystemExit(3)", mode="per-call")
    assert failing["cells"][0]["status"] == "error"
    assert await agent_kernels(jp_serverapp) == before


async def test_init_step_cwd_env_sys_path(evaluate, jp_root_dir):
    (jp_root_dir / "proj").mkdir()
    (jp_root_dir / "proj" / "helper_mod.py").write_text("VALUE = 'imported'\n")
    result = await evaluate(
        "import os, sys, helper_mod\n"
        "print(os.getcwd())\nprint(os.environ['MY_VAR'])\nprint(os.environ['PI_SESSION_FILE'])\n"
        "print(os.path.isdir(os.environ['ARTIFACTS']))\nprint(helper_mod.VALUE)\n"
        "print(sys.path[0] == os.getcwd())",
        cwd="proj",
        env={"MY_VAR": "hello"},
        session_file="/tmp/session.jsonl",
        session="initcheck",
    )
    lines = result["cells"][0]["output"].splitlines()
    assert Path(lines[0]).resolve() == (jp_root_dir / "proj").resolve()
    assert lines[1:] == ["hello", "/tmp/session.jsonl", "True", "imported", "True"]


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"cwd": "../outside"}, "'cwd' must be an existing directory inside the server root"),
        ({"cwd": "missing-dir"}, "'cwd' must be an existing directory inside the server root"),
        ({"env": {"A": 1}}, "'env.A' must be a string, got int"),
        ({"env": {"BAD KEY": "x"}}, "is not a valid environment variable name"),
        ({"mode": "forever"}, "unknown mode 'forever' (expected one of: session, per-call)"),
        ({"timeout": "10"}, "'timeout' must be a number of seconds, got str"),
        ({"session": "../x"}, "'session' must be 1-64 characters"),
        ({"bogus": 1}, "unknown field 'bogus'"),
    ],
)
async def test_bad_eval_requests(api, fields, fragment):
    status, answer = await api("POST", "eval", body={"cells": [{"code": "1"}], **fields})
    assert status == 400
    assert fragment in answer["message"]


async def test_bad_cells(api):
    for body, fragment in (
        ({}, "'cells' is required"),
        ({"cells": []}, "'cells' must be a non-empty array"),
        ({"cells": [{"code": 1}]}, "cells[0]: 'code' must be a string, got int"),
        ({"cells": ["1+1"]}, "cells[0]: must be an object"),
    ):
        status, answer = await api("POST", "eval", body=body)
        assert status == 400 and fragment in answer["message"], answer


async def test_queue_order_on_one_session(evaluate, api):
    """Requests on one session run one at a time, in the order they arrived."""

    async def session_state() -> dict[str, Any]:
        _, listing = await api("GET", "sessions")
        return next(s for s in listing["sessions"] if s["name"] == "fifo")

    async def wait_until(predicate) -> None:
        for _ in range(200):
            if predicate(await session_state()):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("session never reached the expected state")

    await evaluate("order = []", session="fifo")
    calls = [asyncio.ensure_future(evaluate("import time; time.sleep(1); order.append(0)", session="fifo"))]
    await wait_until(lambda s: s["busy"])
    for i in range(1, 6):
        calls.append(asyncio.ensure_future(evaluate(f"order.append({i})", session="fifo")))
        await wait_until(lambda s, i=i: s["queue_depth"] == i)
    await asyncio.gather(*calls)
    result = await evaluate("print(order)", session="fifo")
    assert result["output"] == f"{list(range(6))}\n"


async def test_two_first_calls_create_one_kernel(evaluate, jp_serverapp):
    before = await agent_kernels(jp_serverapp)
    a, b = await asyncio.gather(evaluate("1", session="twin"), evaluate("2", session="twin"))
    assert a["kernel_id"] == b["kernel_id"]
    assert len(await agent_kernels(jp_serverapp) - before) == 1


async def test_concurrent_sessions_and_lru_eviction(evaluate, api, jp_serverapp):
    a, b = await asyncio.gather(
        evaluate("import time; time.sleep(0.5); print('a')", session="a"),
        evaluate("import time; time.sleep(0.5); print('b')", session="b"),
    )
    assert a["output"] == "a\n" and b["output"] == "b\n" and a["kernel_id"] != b["kernel_id"]
    await evaluate("print('touch a')", session="a")
    c = await evaluate("print('c')", session="c")  # max_sessions=2: evicts b (least recently used)
    _status, listing = await api("GET", "sessions")
    names = sorted(s["name"] for s in listing["sessions"])
    assert names == ["a", "c"]
    assert listing["totals"]["evictions"] == 1
    assert b["kernel_id"] not in jp_serverapp.kernel_manager.list_kernel_ids()
    assert c["kernel_id"] in jp_serverapp.kernel_manager.list_kernel_ids()


async def test_a_session_that_went_says_so_to_its_next_call(evaluate, api, jp_serverapp):
    """Evicted, idle-culled or deleted: the next call naming the session is told its state is gone."""
    await evaluate("x = 1", session="a")
    await evaluate("y = 1", session="b")
    await evaluate("1", session="c")  # max_sessions=2: evicts a
    again = await evaluate("x", session="a")  # evicts b
    lost = again["session_lost"]
    assert lost["reason"] == "evicted" and "max_sessions=2" in lost["message"] and lost["at"].endswith("Z")
    assert again["output"].startswith("[Session 'a' was evicted to make room for session 'c'")
    assert "its variables and imports are gone" in again["output"] and "NameError" in again["output"]
    assert (await evaluate("1", session="a"))["session_lost"] is None  # told once
    # idle culling
    sessions = jp_serverapp.web_app.settings["jupyter_agent_tools"].eval_service.sessions
    sessions.idle_timeout = 1e-9
    await sessions.sweep()
    sessions.idle_timeout = 300.0
    culled = await evaluate("1", session="a")
    assert culled["session_lost"]["reason"] == "idle" and "idle_timeout" in culled["output"]
    # deleted
    status, _ = await api("DELETE", "sessions", "a")
    assert status == 204
    deleted = await evaluate("1", session="a")
    assert deleted["session_lost"]["reason"] == "deleted" and "was deleted" in deleted["output"]
    # a session never seen before has nothing to be told
    assert (await evaluate("1", session="fresh"))["session_lost"] is None


async def test_token_requests_have_one_stable_owner_that_hides_the_token(evaluate, api, jp_serverapp):
    await evaluate("1", session="mine")
    await evaluate("1", session="also-mine")
    _status, listing = await api("GET", "sessions")
    owners = {s["owner"] for s in listing["sessions"] if s["name"] in ("mine", "also-mine")}
    token = jp_serverapp.identity_provider.token
    (owner,) = owners  # jupyter_server names every token request a new random anonymous user
    assert owner == "the server's owner" and token not in json.dumps(listing)  # never the token's hash either


async def test_all_sessions_busy_answers_503(evaluate, api):
    slow = [
        asyncio.ensure_future(evaluate("import time; time.sleep(4)", session=name)) for name in ("p", "q")
    ]
    for _ in range(100):
        status, listing = await api("GET", "sessions")
        if sum(s["busy"] for s in listing["sessions"]) == 2:
            break
        await asyncio.sleep(0.1)
    status, answer = await api("POST", "eval", body={"cells": [{"code": "1"}], "session": "r"})
    assert status == 503
    assert "busy" in answer["message"]
    await asyncio.gather(*slow)


async def test_session_listing_delete_and_interrupt(evaluate, api, jp_serverapp):
    first = await evaluate("1", session="work")
    status, listing = await api("GET", "sessions")
    (entry,) = [s for s in listing["sessions"] if s["name"] == "work"]
    assert entry["kernel_id"] == first["kernel_id"] and entry["mode"] == "session"
    assert entry["busy"] is False and entry["queue_depth"] == 0 and entry["restarts"] == 0
    running = asyncio.ensure_future(evaluate("import time; time.sleep(30)", session="work", timeout=60))
    for _ in range(100):
        status, listing = await api("GET", "sessions")
        if any(s["busy"] for s in listing["sessions"] if s["name"] == "work"):
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)
    status, answer = await api("POST", "sessions", "work", "interrupt", body={})
    assert status == 200 and answer["interrupted"] is True
    result = await running
    assert result["cancelled"] is True and result["timed_out"] is False
    status, _ = await api("DELETE", "sessions", "work")
    assert status == 204
    assert first["kernel_id"] not in jp_serverapp.kernel_manager.list_kernel_ids()
    status, answer = await api("DELETE", "sessions", "work")
    assert status == 404 and answer["message"] == "Session not found: work"


async def test_idle_sweep(jp_serverapp, evaluate):
    app = jp_serverapp.web_app.settings["jupyter_agent_tools"]
    sessions = app.eval_service.sessions
    result = await evaluate("1", session="sleepy")
    sessions.idle_timeout = 0.2
    await asyncio.sleep(0.4)
    await sessions.sweep()
    assert sessions.get("sleepy") is None
    assert result["kernel_id"] not in jp_serverapp.kernel_manager.list_kernel_ids()
    assert sessions.totals["idle_shutdowns"] == 1


async def test_truncation_and_artifact(evaluate, api):
    code = "for i in range(20000):\n    print(f'line {i} héllo 日本')"
    result = await evaluate(code)
    cell = result["cells"][0]
    assert cell["truncated"] is True
    assert cell["total_lines"] == 20000
    assert cell["output_bytes"] <= 50 * 1024
    assert cell["output"].startswith("[Showing lines ")
    assert f"Full: artifact://{cell['artifact_id']}]" in cell["output"]
    assert cell["output"].rstrip().endswith("line 19999 héllo 日本")


async def test_artifact_route_returns_full_text(evaluate, jp_fetch):
    result = await evaluate("for i in range(10000):\n    print('ü' * 10, i)")
    artifact_id = result["cells"][0]["artifact_id"]
    response = await jp_fetch("api", "agent", "artifacts", artifact_id)
    text = response.body.decode("utf-8")
    assert text.splitlines() == [f"{'ü' * 10} {i}" for i in range(10000)]
    missing = await jp_fetch("api", "agent", "artifacts", "nope", raise_error=False)
    assert missing.code == 404


async def test_stream_form(jp_fetch):
    response, events = await stream(
        jp_fetch,
        {
            "cells": [
                {
                    "code": "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.3)",
                    "title": "count",
                },
                {"code": "from IPython.display import JSON; JSON({'k': 1})"},
            ],
            "session": "streamer",
        },
    )
    assert response.code == 200
    assert response.headers["Content-Type"] == "application/x-ndjson"
    types = [e["type"] for e in events]
    assert types[0] == "cell_start" and types[-1] == "result"
    chunks = [e["text"] for e in events if e["type"] == "chunk" and e["index"] == 0]
    assert len(chunks) >= 2  # text arrived as it was printed, not all at once
    assert "".join(chunks) == "0\n1\n2\n"
    assert any(e["type"] == "display" and e["display"]["type"] == "json" for e in events)
    assert types.count("cell_end") == 2
    result = events[-1]["result"]
    assert result["output"].startswith("[1/2] count\n0\n1\n2\n")


async def test_stream_sends_one_big_output_message_whole_to_a_client_that_keeps_up(jp_fetch):
    code = "import sys\n_ = sys.stdout.write('ab' * 5_000_000)"  # unflushed: one 10 MB iopub message
    response, events = await stream(jp_fetch, {"cells": [{"code": code}], "session": "big"}, timeout=120)
    assert response.code == 200 and not [e for e in events if e["type"] == "gap"]
    chunks = [e["text"] for e in events if e["type"] == "chunk"]
    assert max(len(c) for c in chunks) <= 1 << 20  # sent as lines of at most 1 MiB of text
    assert "".join(chunks) == "ab" * 5_000_000


async def test_stream_heartbeat(jp_serverapp, jp_fetch):
    app = jp_serverapp.web_app.settings["jupyter_agent_tools"]
    app.stream_heartbeat_interval = 0.3
    _, events = await stream(
        jp_fetch,
        {"cells": [{"code": "import time; time.sleep(1.5)"}], "session": "beat"},
    )
    assert sum(e["type"] == "heartbeat" for e in events) >= 2
    assert events[-1]["type"] == "result"


async def test_client_disconnect_interrupts(jp_http_port, jp_base_url, jp_auth_header, evaluate):
    await evaluate("import time\nprogress = []", session="cut")
    url = f"{jp_base_url}api/agent/eval"
    reader, writer = await asyncio.open_connection("127.0.0.1", jp_http_port)
    body = json.dumps(
        {
            "cells": [{"code": "for i in range(300):\n    progress.append(i)\n    time.sleep(0.1)"}],
            "session": "cut",
            "timeout": 120,
        }
    ).encode()
    headers = "".join(f"{k}: {v}\r\n" for k, v in jp_auth_header.items())
    writer.write(
        f"POST {url} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Accept: application/x-ndjson\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")
    await asyncio.sleep(1.0)
    writer.close()
    # The disconnect interrupts the loop: the next call on the session runs promptly and sees
    # that the loop stopped long before its 300 iterations.
    result = await evaluate("print(len(progress))", session="cut", timeout=30)
    count = int(result["output"])
    await asyncio.sleep(0.5)
    assert count < 100
    again = await evaluate("print(len(progress))", session="cut")
    assert int(again["output"]) == count


async def test_descriptors_do_not_grow_over_200_evals(evaluate):
    await evaluate("1", session="fd")
    for _ in range(20):
        await evaluate("1", session="fd")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(200):
        await evaluate("1+1", session="fd")
    after = len(os.listdir("/proc/self/fd"))
    assert after - before <= 5, (before, after)


async def _until_session(api, name: str, check) -> None:
    """Wait (at most 10 s) until the listing shows session ``name`` passing ``check``."""
    for _ in range(100):
        _, listing = await api("GET", "sessions")
        if any(check(s) for s in listing["sessions"] if s["name"] == name):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"session {name!r} never got there: {listing}")


async def test_delete_during_run_leaves_no_kernel(evaluate, api, jp_serverapp):
    before = await agent_kernels(jp_serverapp)
    await evaluate("1", session="gone")
    # sent one after the other as the server takes them: two requests sent at once may arrive either way
    running = asyncio.ensure_future(evaluate("import time; time.sleep(30)", session="gone", timeout=60))
    await _until_session(api, "gone", lambda s: s["busy"])
    waiting = asyncio.ensure_future(evaluate("print('queued')", session="gone", timeout=60))
    await _until_session(api, "gone", lambda s: s["queue_depth"] >= 1)
    status, _ = await api("DELETE", "sessions", "gone")
    assert status == 204
    result = await running
    assert result["cancelled"] is True
    queued = await waiting  # the queued call runs on a fresh session of the same name, and is told so
    assert queued["session_lost"]["reason"] == "deleted"
    assert queued["output"].endswith("this call runs in a new kernel.]\nqueued\n")
    status, _ = await api("DELETE", "sessions", "gone")
    assert status == 204
    assert await agent_kernels(jp_serverapp) == before
