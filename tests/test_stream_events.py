"""The stream's events on the client side: decoding a line, and the one run loop the CLI's plain and machine
renderers share (no server: the events are what a stream sends)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_agent_tools.cli.render import Renderer, RunPlan
from jupyter_agent_tools.cli.render.machine import MachineRenderer
from jupyter_agent_tools.cli.render.plain import PlainRenderer
from jupyter_agent_tools.client import AgentAPIError, ApprovalDenied, EvalEvent
from jupyter_agent_tools.client.calls import decode_event

pytestmark = pytest.mark.quick

ANSWER = {"output": "größe\n", "cells": []}
SVG = "<svg xmlns='http://www.w3.org/2000/svg'/>"
EVENTS: list[EvalEvent] = [
    {"type": "approval", "approval_id": 3, "state": "pending", "summary": "run 1 cell"},
    {"type": "approval", "approval_id": 3, "state": "approved", "decided_by": "ada"},
    {"type": "cell_start", "index": 0, "title": None},
    {"type": "chunk", "index": 0, "name": "stdout", "text": "größe\n"},
    {"type": "display", "index": 0, "display": {"type": "image", "mime": "image/svg+xml", "data": SVG}},
    {"type": "cell_end", "index": 0, "status": "complete", "exit_code": 0, "duration_ms": 4},
    {"type": "result", "result": ANSWER},
]


def test_a_line_decodes_to_its_event_and_a_line_that_is_no_event_is_an_api_error() -> None:
    line = json.dumps(EVENTS[3], ensure_ascii=False)
    assert decode_event(line + "\n") == EVENTS[3]
    assert decode_event("  \n") is None
    for bad in ("[1, 2]", '{"index": 0}', '{"type": 7}'):
        with pytest.raises(AgentAPIError) as raised:
            decode_event(bad)
        assert raised.value.reason == "bad_event" and bad in raised.value.message


def test_plain_and_machine_renderers_share_the_run_loop(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
):
    """Both save the image and note it, and return the result; plain prints the output and says who
    approved, ``--ndjson`` prints each event as it came, ``--json`` the answer alone."""
    answers = {}
    renderers: list[tuple[str, Renderer]] = [
        ("plain", PlainRenderer()),
        ("ndjson", MachineRenderer(ndjson=True)),
        ("json", MachineRenderer(ndjson=False)),
    ]
    for name, renderer in renderers:
        images = tmp_path / name
        answers[name] = renderer.run(iter(EVENTS), RunPlan(None, save_images=images))
        out, err = capsysbinary.readouterr()
        assert (images / "cell1-1.svg").read_text() == SVG
        assert f"saved to {images / 'cell1-1.svg'}" in err.decode()
        if name == "plain":
            assert out.decode() == "größe\n"
            assert "Waiting for approval 3" in err.decode() and "Approved by ada" in err.decode()
        elif name == "ndjson":
            assert [json.loads(line) for line in out.splitlines()] == EVENTS
        else:
            assert json.loads(out) == ANSWER
    assert answers["plain"] == answers["ndjson"] == answers["json"] == ANSWER


@pytest.mark.parametrize(
    "renderer", [PlainRenderer(), MachineRenderer(ndjson=True)], ids=["plain", "machine"]
)
def test_the_run_loop_raises_an_error_event_and_a_stream_without_result(renderer: Renderer) -> None:
    denied: EvalEvent = {
        "type": "error",
        "status": 403,
        "message": "ada denied run 1 cell",
        "reason": "approval_denied",
        "approval_id": 3,
    }
    with pytest.raises(ApprovalDenied) as raised:
        renderer.run(iter([*EVENTS[:3], denied]), RunPlan(None))
    assert (raised.value.status, raised.value.approval_id) == (403, 3)
    with pytest.raises(AgentAPIError) as raised_truncated:
        renderer.run(iter(EVENTS[:-1]), RunPlan(None))
    assert raised_truncated.value.reason == "truncated"
