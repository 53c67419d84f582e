"""The event log of a detached run, without a server: numbering, replay from any point (memory and
artifact), the per-run cap's gap event, and events that could not be kept said as 'lost'."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jupyter_agent_tools.artifacts import ArtifactStore
from jupyter_agent_tools.runs.log import RunLog
from jupyter_agent_tools.runs.registry import final_state

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


def read_all(log: RunLog, after: int = 0, batch: int = 300) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        lines, after = log.read(after, batch)
        if not lines:
            return out
        out += [json.loads(line) for line in lines]


def chunks(n: int) -> list[dict[str, Any]]:
    return [{"type": "chunk", "index": 0, "name": "stdout", "text": f"line {i}\n"} for i in range(n)]


def test_events_are_numbered_and_replayed_from_memory_and_artifact(tmp_path: Path) -> None:
    store = ArtifactStore(root=tmp_path / "artifacts")
    log = RunLog(
        memory_bytes=1000,
        max_bytes=10**6,
        open_artifact=lambda: store.create("_runs"),
        artifact_path=store.path,
    )
    for event in [{"type": "cell_start", "index": 0, "title": None}, *chunks(200)]:
        log.append(event)
    assert log.artifact_id is not None and log.memory_held <= 1000
    everything = read_all(log)
    assert [e["seq"] for e in everything] == list(range(1, 202))
    assert "".join(e.get("text", "") for e in everything) == "".join(f"line {i}\n" for i in range(200))
    for after in (0, 1, 50, 150, 199, 200, 201):
        assert read_all(log, after) == everything[after:]
    log.finish()
    assert log.memory_held == 0  # moved to the artifact
    assert read_all(log) == everything
    assert store.total_bytes == log.total  # counted against the artifacts' cap


def test_past_max_bytes_text_is_left_out_with_one_gap_per_stream() -> None:
    log = RunLog(memory_bytes=5000, max_bytes=5000)
    for event in chunks(1000):
        log.append(event)
    log.append({"type": "cell_end", "index": 0, "status": "complete"})
    events = read_all(log)
    assert [e["type"] for e in events[-2:]] == ["gap", "cell_end"]
    kept = "".join(e.get("text", "") for e in events)
    assert len(kept) + events[-2]["bytes"] == sum(len(f"line {i}\n") for i in range(1000))
    assert log.total <= 5000 + 200


def test_events_that_could_not_be_kept_are_said_lost() -> None:
    def refuse() -> tuple[str, Any]:
        raise OSError("disk full")

    log = RunLog(memory_bytes=500, max_bytes=10**6, open_artifact=refuse)
    for event in chunks(100):
        log.append(event)
    events = read_all(log)
    assert events[0]["type"] == "lost" and "seq" not in events[0]
    first_kept = events[0]["to_seq"] + 1
    assert events[0]["from_seq"] == 1
    assert [e["seq"] for e in events[1:]] == list(range(first_kept, 101))
    # asked from inside the lost stretch: the rest of it is said lost, then what is kept
    assert read_all(log, 3)[0] == {**events[0], "from_seq": 4}


@pytest.mark.parametrize(
    ("result", "cancel", "state"),
    [
        ({"cells": [{"status": "complete"}]}, False, "complete"),
        ({"cells": [{"status": "error"}]}, False, "error"),
        ({"cells": [], "error": "restart limit"}, False, "error"),
        ({"cells": [{"status": "cancelled"}], "cancelled": True}, True, "cancelled"),
        ({"cells": [{"status": "cancelled"}], "cancelled": True}, False, "interrupted"),
        ({"cells": [{"status": "cancelled"}], "timed_out": True}, False, "timed_out"),  # issue 35
        ({"cells": [{"status": "cancelled"}], "cancelled": True, "timed_out": True}, False, "timed_out"),
        ({"cells": [{"status": "complete"}]}, True, "complete"),  # it ended before the cancel came
    ],
)
def test_final_state_from_the_answer(result: dict[str, Any], cancel: bool, state: str) -> None:
    assert final_state(result, cancel) == state
