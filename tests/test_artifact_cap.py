"""The artifacts' byte cap (``ArtifactStore.max_bytes``): through the real eval route with real kernels, and
the store on its own."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_agent_tools.artifacts import ArtifactFull, ArtifactStore
from jupyter_agent_tools.errors import NotFound
from jupyter_agent_tools.execution.sink import OutputSink

pytestmark = pytest.mark.timeout(240)

CAP = 300_000
SPILL_BYTES = 200_000  # what SPILL prints: 200 lines of 1000 bytes
SPILL = "print(('x' * 999 + '\\n') * 200, end='')"


@pytest.fixture
def artifacts_root(tmp_path: Path) -> Path:
    return tmp_path / "artifacts"


@pytest.fixture
def jp_server_config(artifacts_root: Path) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_agent_tools": True}},
        "ArtifactStore": {"root_dir": str(artifacts_root), "max_bytes": CAP},
        "CellExecutor": {"max_output_bytes": 1024},
        "EvalSessionManager": {"max_sessions": 3},
    }


def store(jp_serverapp: Any) -> ArtifactStore:
    artifacts: ArtifactStore = jp_serverapp.web_app.settings["jupyter_agent_tools"].eval_service.artifacts
    return artifacts


def bytes_on_disk(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.txt") if p.is_file())


async def artifact(jp_fetch: Any, artifact_id: str) -> tuple[int, bytes]:
    response = await jp_fetch("api", "agent", "artifacts", artifact_id, raise_error=False)
    return response.code, response.body


async def test_old_artifacts_of_idle_sessions_go_when_a_spill_passes_the_cap(
    evaluate, jp_fetch, jp_serverapp, artifacts_root
) -> None:
    first = (await evaluate(SPILL, session="first"))["cells"][0]
    assert first["artifact_id"] and f"Full: artifact://{first['artifact_id']}]" in first["output"]
    second = (await evaluate(SPILL, session="second"))["cells"][0]
    # the cap holds one spill and a half: the first session's (idle, oldest) made room for the second's
    assert f"Full: artifact://{second['artifact_id']}]" in second["output"]
    assert (await artifact(jp_fetch, first["artifact_id"]))[0] == 404
    status, body = await artifact(jp_fetch, second["artifact_id"])
    assert status == 200 and len(body) == SPILL_BYTES

    # a spill loop, one session's calls among others': each spill is whole, the directory stays under
    # the cap, and the running total is what the disk holds
    for i, session in enumerate(["first", "first", "second", "third", "first", "third"]):
        cell = (await evaluate(SPILL, session=session))["cells"][0]
        assert f"Full: artifact://{cell['artifact_id']}]" in cell["output"], (i, cell["output"][:300])
        status, body = await artifact(jp_fetch, cell["artifact_id"])
        assert status == 200 and len(body) == SPILL_BYTES
        assert bytes_on_disk(artifacts_root) == store(jp_serverapp).total_bytes <= CAP
    print(f"\n8 spills of {SPILL_BYTES} bytes, cap {CAP}: {bytes_on_disk(artifacts_root)} bytes left on disk")
    assert store(jp_serverapp).removed_for_cap == 7


async def test_a_running_calls_artifact_stays_and_the_spill_the_cap_cut_says_so(
    evaluate, jp_fetch, jp_serverapp, artifacts_root, tmp_path
) -> None:
    flag = tmp_path / "go-on"
    wait = f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.02)"
    events: list[dict[str, Any]] = []
    first_cell_done = asyncio.Event()
    pending = b""

    def on_chunk(chunk: bytes) -> None:
        nonlocal pending
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            events.append(json.loads(line))
            if events[-1] == {**events[-1], "type": "cell_end", "index": 0}:
                first_cell_done.set()

    body = {"cells": [{"code": SPILL}, {"code": wait}], "session": "busy", "timeout": 180}
    running = asyncio.ensure_future(
        jp_fetch(
            "api",
            "agent",
            "eval",
            method="POST",
            body=json.dumps(body),
            headers={"Accept": "application/x-ndjson"},
            streaming_callback=on_chunk,
            request_timeout=200,
        )
    )
    try:
        # the running call's first cell has spilled and closed its artifact; its second cell waits
        spilled = asyncio.ensure_future(first_cell_done.wait())
        await asyncio.wait({running, spilled}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
        spilled.cancel()
        assert first_cell_done.is_set(), (running.done() and running.result(), events)
        (busy,) = artifacts_root.glob("busy.*")  # named by the session and its owner
        assert bytes_on_disk(busy) == SPILL_BYTES

        cut = (await evaluate(SPILL, session="other"))["cells"][0]
        kept = CAP - SPILL_BYTES  # the busy call's artifact could not go: the new one got what was left
        assert cut["truncated"] and cut["total_bytes"] == SPILL_BYTES
        assert "Full: artifact://" not in cut["output"]
        notice = cut["output"].splitlines()[0]
        assert notice.endswith(
            f"Incomplete: artifact://{cut['artifact_id']} holds only the first {kept} of {SPILL_BYTES} bytes "
            "(cut at the artifacts' cap, ArtifactStore.max_bytes)]"
        ), notice
        status, body = await artifact(jp_fetch, cut["artifact_id"])
        assert status == 200 and body == (b"x" * 999 + b"\n") * (kept // 1000)
        assert bytes_on_disk(artifacts_root) == CAP
    finally:
        flag.write_text("")
    await running
    assert events[-1]["type"] == "result", events[-1]
    kept_whole = events[-1]["result"]["cells"][0]
    assert f"Full: artifact://{kept_whole['artifact_id']}]" in kept_whole["output"]
    status, body = await artifact(jp_fetch, kept_whole["artifact_id"])
    assert status == 200 and len(body) == SPILL_BYTES

    # the call is over: its artifact is the oldest of an idle session now, and goes first
    after = (await evaluate(SPILL, session="third"))["cells"][0]
    assert f"Full: artifact://{after['artifact_id']}]" in after["output"]
    assert (await artifact(jp_fetch, kept_whole["artifact_id"]))[0] == 404
    assert (await artifact(jp_fetch, cut["artifact_id"]))[0] == 200
    assert bytes_on_disk(artifacts_root) == store(jp_serverapp).total_bytes <= CAP


# -- the store on its own -------------------------------------------------------------------------------


def test_a_display_too_big_for_the_cap_is_not_saved_in_part(tmp_path: Path) -> None:
    artifacts = ArtifactStore(root=tmp_path, max_bytes=1000)
    sink = OutputSink(max_bytes=100, open_artifact=lambda: artifacts.create("s"))
    assert sink.spill("y" * 1000) is not None  # fits exactly
    assert sink.spill("z" * 1001) is None  # larger than the cap: not saved, not even in part
    assert list(tmp_path.rglob("*.txt")) == [] and artifacts.total_bytes == 0


def test_the_cap_counts_what_was_there_at_start(tmp_path: Path) -> None:
    first = ArtifactStore(root=tmp_path, max_bytes=0)
    ids = []
    for size in (400, 300, 200):
        artifact_id, handle = first.create("old")
        with handle:
            handle.write(b"a" * size)
        ids.append(artifact_id)
        time.sleep(0.01)  # distinct modification times: the order a restarted server sees
    assert first.total_bytes == 900

    again = ArtifactStore(root=tmp_path, max_bytes=600)  # a restart on the same directory, with a cap
    assert again.total_bytes == 500 and bytes_on_disk(tmp_path) == 500  # the oldest went
    with pytest.raises(NotFound):
        again.path(ids[0])
    assert again.path(ids[1]).stat().st_size == 300
    artifact_id, handle = again.create("new")
    with pytest.raises(ArtifactFull) as cut, handle:
        handle.write(b"b" * 700)
    assert cut.value.kept == 600 and again.total_bytes == 600 == bytes_on_disk(tmp_path)


def test_a_cut_artifact_ends_on_a_whole_character(tmp_path: Path) -> None:
    artifacts = ArtifactStore(root=tmp_path, max_bytes=5)
    artifact_id, handle = artifacts.create("s")
    with pytest.raises(ArtifactFull) as cut, handle:
        handle.write("aé日本".encode())  # 1 + 2 + 3 + 3 bytes: the cap falls inside 日
    assert cut.value.kept == 3 and artifacts.path(artifact_id).read_text(encoding="utf-8") == "aé"
    assert artifacts.total_bytes == 3
