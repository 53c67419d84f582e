"""How results are shown: rendered on a terminal (``terminal``), plain text for agents and pipes
(``plain``), or the API's own JSON / NDJSON (``machine``). Commands call one :class:`Renderer`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...client import AgentAPIError, EvalEvent, calls
from ...stream_events import Approval, Error


@dataclass(frozen=True)
class NotebookCall:
    """What a notebook command asked for: its call line on a terminal."""

    action: str
    path: str
    cell: str | None = None
    cell_type: str | None = None


@dataclass(frozen=True)
class RunPlan:
    """What a run will show: the cells' titles (``None`` when unknown beforehand, as for a notebook run).

    Watching a detached run (``watching``), the times come from the run (``started``, ``ended`` and each
    cell's start, seconds since the epoch), not from when watching began; Ctrl-C stops only the watching.
    ``where`` names what ran (a notebook's path) for the summary line.
    """

    titles: list[str | None] | None
    save_images: Path | None = None
    where: str | None = None
    watching: bool = False
    started: float | None = None
    ended: float | None = None
    cells_started: dict[int, float] = field(default_factory=dict)


class Renderer(Protocol):
    def run(self, events: Iterator[EvalEvent], plan: RunPlan) -> dict[str, Any]:
        """Consume a run's event stream, show it, and return its result (raise on an ``error`` event)."""

    def notebook(
        self, answer: dict[str, Any], cells: list[dict[str, Any]], outputs: bool, expand: bool
    ) -> None:
        """Show a notebook read: ``cells`` is the selection to show."""

    def notebook_change(self, call: NotebookCall, answer: dict[str, Any], expand: bool) -> None:
        """Show the answer of a notebook change."""

    def sessions(self, answer: dict[str, Any]) -> None:
        """Show the session list."""

    def done(self, message: str, answer: dict[str, Any]) -> None:
        """Show a one-line success (a session interrupted or shut down)."""

    def listing(self, text: str, answer: dict[str, Any]) -> None:
        """Show a listing or a report (changes, a diff, runs, files) as it is: no success mark."""

    def text(self, pieces: Iterable[str]) -> None:
        """Print text as it is (an artifact)."""

    def error(self, message: str, call: NotebookCall | None = None) -> None:
        """Show a failure (on stderr)."""

    def note(self, message: str) -> None:
        """Say something on stderr that is not the answer (which server was picked, ...)."""


def stream_failure(event: Error) -> AgentAPIError:
    """The error an ``error`` event of a stream stands for (a denial by the person: ApprovalDenied)."""
    return calls.stream_failure(event, "")


def approval_line(event: Approval) -> str:
    """What an ``approval`` event of a stream says: waiting for the person, or approved."""
    if event["state"] == "pending":
        return f"Waiting for approval {event.get('approval_id')} in JupyterLab ({event.get('summary')})…"
    return f"Approved by {event.get('decided_by') or 'the person'}: running."


def wants_terminal(plain: bool) -> bool:
    """Render for a person: stdout is a terminal that can show it, and ``--plain`` was not given."""
    if plain or os.environ.get("TERM") == "dumb":
        return False
    return sys.stdout.isatty()


def choose(json_out: bool, ndjson_out: bool, plain: bool) -> Renderer:
    if json_out or ndjson_out:
        from .machine import MachineRenderer

        return MachineRenderer(ndjson=ndjson_out)
    if wants_terminal(plain):
        from .terminal import TerminalRenderer

        return TerminalRenderer()
    from .plain import PlainRenderer

    return PlainRenderer()
