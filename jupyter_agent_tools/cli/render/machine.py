"""``--json``: the API's JSON answer; ``--ndjson``: a run's events as the server sent them."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from ...client import EvalEvent
from . import NotebookCall, RunPlan
from .plain import PlainRenderer, stream_result


def _nothing(_: Any) -> None:
    return None


def _line(value: Any) -> None:
    sys.stdout.buffer.write(json.dumps(value, ensure_ascii=False).encode("utf-8") + b"\n")
    sys.stdout.buffer.flush()


class MachineRenderer:
    """One JSON document per command (``--json``), or one event per line for runs (``--ndjson``)."""

    def __init__(self, ndjson: bool):
        self.ndjson = ndjson
        self._plain = PlainRenderer()

    def run(self, events: Iterator[EvalEvent], plan: RunPlan) -> dict[str, Any]:
        result = stream_result(events, plan, self.note, _line if self.ndjson else _nothing)
        if not self.ndjson:
            _line(result)
        return result

    def notebook(
        self, answer: dict[str, Any], cells: list[dict[str, Any]], outputs: bool, expand: bool
    ) -> None:
        _line({**answer, "cells": cells})

    def notebook_change(self, call: NotebookCall, answer: dict[str, Any], expand: bool) -> None:
        _line(answer)

    def sessions(self, answer: dict[str, Any]) -> None:
        _line(answer)

    def done(self, message: str, answer: dict[str, Any]) -> None:
        _line(answer)

    def listing(self, text: str, answer: dict[str, Any]) -> None:
        _line(answer)

    def text(self, pieces: Iterable[str]) -> None:
        self._plain.text(pieces)

    def error(self, message: str, call: NotebookCall | None = None) -> None:
        self._plain.error(message, call)

    def note(self, message: str) -> None:
        self._plain.note(message)
