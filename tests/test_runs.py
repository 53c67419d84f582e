"""Detached runs (issue 30): eval and notebook runs that go on without their client; state, events
replayed exactly once in order from any sequence number, cancel, retention, bounds (real kernels)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nbformat
import pytest
from contract import Contract

from jupyter_agent_tools.api_document import openapi_document

pytestmark = pytest.mark.timeout(180)

NDJSON = "application/x-ndjson"
CONTRACT = Contract(openapi_document())


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "RunRegistry": {"runs_db_path": ":memory:"},
    }


def lines(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.decode().splitlines() if line.strip()]


async def events(jp_fetch, run_id: str, after: int = 0, timeout: float | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"after": str(after)}
    if timeout is not None:
        params["timeout"] = str(timeout)
    response = await jp_fetch("api", "agent", "runs", run_id, "events", params=params)
    assert response.code == 200
    assert response.headers["Content-Type"] == NDJSON
    return [e for e in lines(response.body) if e["type"] != "heartbeat"]


async def detach(api, route: tuple[str, ...], body: dict[str, Any]) -> dict[str, Any]:
    status, answer = await api("POST", *route, body={**body, "detach": True})
    assert status == 202, answer
    assert answer["location"].endswith(f"/api/agent/runs/{answer['run_id']}")
    assert answer["state"] in ("queued", "running")
    return answer


async def finished(api, run_id: str, wait: float = 60) -> dict[str, Any]:
    status, run = await api("GET", "runs", run_id, params={"wait": str(wait)})
    assert status == 200, run
    assert run["state"] not in ("queued", "running"), run
    return run


def comparable(stream: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events without seq, heartbeats and times (which differ between two runs of the same code)."""
    out = []
    for event in stream:
        if event["type"] == "heartbeat":
            continue
        event = {k: v for k, v in event.items() if k not in ("seq", "duration_ms")}
        if event["type"] == "result":
            result = event["result"]
            event = {
                "type": "result",
                "output": result["output"],
                "cells": [c["status"] for c in result["cells"]],
            }
        out.append(event)
    return out


CODE = "import time\nfor i in range(6):\n    print(i, flush=True)\n    time.sleep(0.25)\n'done'"


async def test_detached_eval_completes_and_its_events_match_an_attached_run(api, jp_fetch):
    response = await jp_fetch(
        "api",
        "agent",
        "eval",
        method="POST",
        headers={"Accept": NDJSON},
        body=json.dumps({"cells": [{"code": CODE}], "session": "attached"}),
    )
    attached = lines(response.body)
    started = await detach(api, ("eval",), {"cells": [{"code": CODE}], "session": "detached"})
    assert started["kind"] == "eval" and started["target"] == "detached"
    run = await finished(api, started["run_id"])
    assert run["state"] == "complete"
    assert run["result"]["output"].startswith("0\n1\n2")
    assert run["cells"] == [
        {
            "index": 0,
            "title": None,
            "status": "complete",
            "started": run["cells"][0]["started"],
            "exit_code": 0,
            "duration_ms": run["cells"][0]["duration_ms"],
        }
    ]
    assert run["started"] <= run["cells"][0]["started"] <= run["ended"]  # ISO 8601 UTC, same format
    got = await events(jp_fetch, started["run_id"])
    assert [e["seq"] for e in got] == list(range(1, len(got) + 1))
    assert got[-1]["type"] == "result"
    assert comparable(got) == comparable(attached)
    status, listing = await api("GET", "runs")
    assert status == 200
    CONTRACT.assert_response("POST", "/api/agent/eval", 202, started)
    CONTRACT.assert_response("GET", "/api/agent/runs/{run_id}", 200, run)
    CONTRACT.assert_response("GET", "/api/agent/runs", 200, listing)
    for event in got:
        CONTRACT.assert_response("GET", "/api/agent/runs/{run_id}/events", 200, event, NDJSON)
    assert started["run_id"] in [r["run_id"] for r in listing["runs"]]


async def test_reconnecting_midway_gets_every_event_once_in_order(api, jp_fetch):
    started = await detach(api, ("eval",), {"cells": [{"code": CODE}, {"code": "print('second')"}]})
    seen: list[dict[str, Any]] = []
    for _ in range(200):  # short connections: each ends after 0.3 s, the next goes on from the last seq
        after = seen[-1]["seq"] if seen else 0
        seen += await events(jp_fetch, started["run_id"], after=after, timeout=0.3)
        if seen and seen[-1]["type"] in ("result", "error"):
            break
    assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    whole = await events(jp_fetch, started["run_id"])
    assert seen == whole
    # from the middle: exactly the rest
    middle = len(whole) // 2
    assert await events(jp_fetch, started["run_id"], after=middle) == whole[middle:]
    assert await events(jp_fetch, started["run_id"], after=len(whole)) == []


async def test_after_beyond_the_last_event_waits_for_the_next(api, jp_fetch):
    started = await detach(
        api, ("eval",), {"cells": [{"code": "import time; time.sleep(1.5); print('late')"}]}
    )
    begun = time.monotonic()
    got = await events(jp_fetch, started["run_id"], after=1)  # cell_start is 1: waits for the rest
    assert time.monotonic() - begun > 0.5
    assert got[0]["seq"] == 2
    assert any(e["type"] == "chunk" and "late" in e["text"] for e in got)


async def test_cancel_interrupts_a_detached_run(api):
    started = await detach(
        api, ("eval",), {"cells": [{"code": "import time; time.sleep(60)"}], "timeout": 120}
    )
    for _ in range(100):
        status, run = await api("GET", "runs", started["run_id"])
        if run["state"] == "running":
            break
        await asyncio.sleep(0.1)
    status, answer = await api("POST", "runs", started["run_id"], "cancel")
    assert status == 200 and answer["cancel_requested"] is True
    CONTRACT.assert_response("POST", "/api/agent/runs/{run_id}/cancel", 200, answer)
    run = await finished(api, started["run_id"], 30)
    assert run["state"] == "cancelled"
    assert run["result"]["cancelled"] is True


async def test_detached_notebook_run_writes_outputs(api, jp_root_dir):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("print('one')"),
        nbformat.v4.new_code_cell("import time; time.sleep(0.5); 6*7"),
    ]
    nbformat.write(nb, jp_root_dir / "detached.ipynb")
    started = await detach(api, ("notebooks", "detached.ipynb", "run"), {"all": True})
    assert started["kind"] == "notebook_run" and started["target"] == "detached.ipynb"
    run = await finished(api, started["run_id"])
    assert run["state"] == "complete", run
    CONTRACT.assert_response("GET", "/api/agent/runs/{run_id}", 200, run)
    assert [c["status"] for c in run["cells"]] == ["complete", "complete"]
    saved = nbformat.read(jp_root_dir / "detached.ipynb", as_version=4)
    assert saved.cells[0].outputs[0]["text"] == "one\n"
    assert saved.cells[1].outputs[0]["data"]["text/plain"] == "42"


async def test_bad_input(api):
    status, answer = await api("POST", "eval", body={"cells": [{"code": "1"}], "detach": "yes"})
    assert status == 400 and "detach" in answer["message"]
    status, answer = await api("POST", "eval", body={"cells": [], "detach": True})
    assert status == 400 and "cells" in answer["message"]
    status, answer = await api(
        "POST", "notebooks", "missing.ipynb", "run", body={"all": True, "detach": True}
    )
    assert status == 404
    status, answer = await api("GET", "runs", "0123456789abcdef")
    assert status == 404 and "Run not found" in answer["message"]
    status, answer = await api("POST", "runs", "0123456789abcdef", "cancel")
    assert status == 404
    started = await detach(api, ("eval",), {"cells": [{"code": "1"}]})
    for after in ("-1", "x", "1.5"):
        status, answer = await api("GET", "runs", started["run_id"], "events", params={"after": after})
        assert status == 400 and "'after'" in answer["message"]
    status, answer = await api("GET", "runs", started["run_id"], "events", params={"timeout": "nan"})
    assert status == 400
    status, answer = await api("GET", "runs", started["run_id"], params={"wait": "-1"})
    assert status == 400
