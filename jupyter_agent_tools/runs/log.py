"""The event log of one detached run: every event numbered, bounded in memory, replayable (no Tornado).

Each event the run emits gets the next sequence number (from 1) and is kept as its NDJSON line
(``{"seq": N, ...}``). The newest lines stay in memory, at most ``memory_bytes``; older ones are moved to
an artifact of the :class:`~jupyter_agent_tools.artifacts.ArtifactStore` (so they count against the
artifacts' cap), from where a reader that reconnects gets them back, in order. The log holds at most
``max_bytes`` of lines in all: past that, output text is not kept, and one ``gap`` event (as on an
attached stream whose client fell behind) says how many bytes of which cell's stream were left out;
every other event is always kept. The run's answer (the last ``result`` event) has the output as an
attached call's answer has it (bounded by ``max_output_bytes``, the whole text in an artifact).

If the artifact cannot be written (the cap was reached and nothing could be removed, a disk error),
the lines moved out of memory are gone: a reader asking for them gets one ``{"type": "lost", ...}``
line (without ``seq``) saying which events, then the events still kept.

Readers hold a sequence number only: a slow reader costs the server nothing but the batch it is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from ..artifacts import ArtifactFull
from ..errors import NotFound
from ..execution.backlog import utf8_prefix, utf8_size
from ..stream_events import Gap, Lost, StreamEvent
from ..text import ndjson_line  # the same encoding as an attached stream (fast for chunks)

INDEX_EVERY = 64 * 1024  # bytes of artifact between two entries of the sparse seq -> offset index
KEEP_IN_MEMORY = 64 * 1024  # bytes of events a finished run may keep in memory rather than in an artifact


def encode(seq: int, event: StreamEvent) -> bytes:
    """``{"seq": seq, ...event}`` as one NDJSON line (UTF-8, not \\u escapes)."""
    return ndjson_line({"seq": seq, **event})


def line_seq(line: bytes) -> int:
    """The sequence number of a line made by :func:`encode`."""
    return int(line[8 : line.index(b",", 8)])


class RunLog:
    """The numbered events of one run; see the module doc."""

    def __init__(
        self,
        *,
        memory_bytes: int,
        max_bytes: int,
        open_artifact: Callable[[], tuple[str, Any]] | None = None,
        artifact_path: Callable[[str], Any] | None = None,
        log: logging.Logger | None = None,
    ):
        self.memory_bytes = max(1, memory_bytes)
        self.max_bytes = max(self.memory_bytes, max_bytes)
        self._open_artifact = open_artifact
        self._artifact_path = artifact_path
        self.log = log or logging.getLogger(__name__)
        self.last_seq = 0
        self._lines: deque[bytes] = deque()  # in memory: seqs first_memory_seq .. last_seq
        self._first_memory_seq = 1
        self.memory_held = 0  # bytes of lines in memory
        self.total = 0  # bytes of lines kept (memory and artifact)
        self.artifact_id: str | None = None
        self._writer: Any = None
        self._file_end = 0  # bytes of whole lines in the artifact
        self._index: list[tuple[int, int]] = []  # (seq, offset) every INDEX_EVERY bytes
        self._spilled_upto = 0  # the last seq in the artifact
        self._broken = False  # the artifact failed: lines leaving memory are lost from then on
        self._gap: Gap | None = None  # text left out, not yet said
        self.skipped = 0  # bytes of output text left out
        self.finished = False
        self._changed = asyncio.Event()

    # -- writing ---------------------------------------------------------------------------------

    def append(self, event: StreamEvent) -> None:
        """Number and keep one event (a chunk's text only as far as ``max_bytes`` allows)."""
        if self.finished:
            return
        if event["type"] == "chunk":
            text = event["text"]
            size = utf8_size(text)
            room = self.max_bytes - self.total - 200  # the line's other fields
            if size > room or self._gap is not None:
                head = utf8_prefix(text, room) if room > 0 and self._gap is None else ""
                if head:
                    self._add({**event, "text": head})
                self._skip(event["index"], event["name"], size - utf8_size(head))
                return
        else:
            self._say_gap()
        self._add(event)

    def finish(self) -> None:
        """No more events: say what was left out, close the artifact, wake every reader."""
        if self.finished:
            return
        self._say_gap()
        self.finished = True
        if self.artifact_id is not None or self.memory_held > KEEP_IN_MEMORY:
            self._move_out()  # a finished run, kept for an hour, holds (almost) no events in memory
        if self._writer is not None:
            with contextlib.suppress(OSError):
                self._writer.close()
        self._wake()

    def discard(self) -> None:
        """Forget the run (it expired): memory now, its artifact too."""
        self.finish()
        self._lines.clear()
        self.memory_held = 0
        if self._writer is not None:
            with contextlib.suppress(OSError):
                self._writer.discard()
            self._writer = None

    def _skip(self, index: int, name: str, size: int) -> None:
        if self._gap is not None and (self._gap["index"], self._gap["name"]) != (index, name):
            self._say_gap()
        if self._gap is None:
            self._gap = {"type": "gap", "index": index, "name": name, "bytes": 0}
        self._gap["bytes"] += size
        self.skipped += size

    def _say_gap(self) -> None:
        gap, self._gap = self._gap, None
        if gap is not None and gap["bytes"]:
            self._add(gap)

    def _add(self, event: StreamEvent) -> None:
        self.last_seq += 1
        line = encode(self.last_seq, event)
        self._lines.append(line)
        self.memory_held += len(line)
        self.total += len(line)
        while self.memory_held > self.memory_bytes and len(self._lines) > 1:
            self._spill(self._lines.popleft())
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _spill(self, line: bytes) -> None:
        """Move the oldest line from memory to the artifact (or lose it if that cannot be written)."""
        seq = self._first_memory_seq
        self._first_memory_seq += 1
        self.memory_held -= len(line)
        if not self._broken:
            try:
                self._write(seq, line)
                return
            except (OSError, ArtifactFull) as e:
                self._broken = True
                self.log.warning("events of a run not kept (their artifact could not be written): %s", e)
        self.total -= len(line)

    def _move_out(self) -> None:
        """Move every line still in memory to the artifact; what cannot be written stays in memory."""
        while self._lines and not self._broken:
            line = self._lines[0]
            try:
                self._write(self._first_memory_seq, line)
            except (OSError, ArtifactFull) as e:
                self._broken = True
                self.log.warning(
                    "events of a run kept in memory (their artifact could not be written): %s", e
                )
                return
            self._lines.popleft()
            self._first_memory_seq += 1
            self.memory_held -= len(line)

    def _write(self, seq: int, line: bytes) -> None:
        if self._writer is None:
            if self._open_artifact is None:
                raise OSError("no artifact store")
            self.artifact_id, self._writer = self._open_artifact()
        if not self._index or self._file_end - self._index[-1][1] >= INDEX_EVERY:
            self._index.append((seq, self._file_end))
        self._writer.write(line)  # ArtifactFull: the cut line is not counted (readers stop before it)
        self._file_end += len(line)
        self._spilled_upto = seq

    # -- reading ---------------------------------------------------------------------------------

    def changed(self) -> asyncio.Event:
        """Set at the next event (or when the run finishes): take it before reading, then wait on it."""
        return self._changed

    def has_after(self, after: int) -> bool:
        return after < self.last_seq

    def read(self, after: int, max_bytes: int) -> tuple[list[bytes], int]:
        """Lines of the events after ``after``, in order, about ``max_bytes`` of them (at least one),
        and the last sequence number they cover."""
        nxt = after + 1
        if nxt > self.last_seq:
            return [], after
        if nxt < self._first_memory_seq:
            lines = self._read_artifact(nxt, max_bytes) if nxt <= self._spilled_upto else None
            if lines:
                return lines, line_seq(lines[-1])
            upto = self._first_memory_seq - 1  # neither in the artifact nor in memory: say so
            note: Lost = {
                "type": "lost",
                "from_seq": nxt,
                "to_seq": upto,
                "message": "these events of the run were not kept (the artifacts' cap, or their artifact "
                "could not be written); the run's answer still has its output",
            }
            return [(json.dumps(note) + "\n").encode()], upto
        out: list[bytes] = []
        size = 0
        for i in range(nxt - self._first_memory_seq, len(self._lines)):
            line = self._lines[i]
            if out and size + len(line) > max_bytes:
                break
            out.append(line)
            size += len(line)
        return out, after + len(out)

    def _read_artifact(self, nxt: int, max_bytes: int) -> list[bytes] | None:
        if self.artifact_id is None or self._artifact_path is None:
            return None
        if self._writer is not None:
            self._writer.flush()
        offset = 0
        for seq, where in self._index:  # few entries: a linear scan is fine
            if seq > nxt:
                break
            offset = where
        try:
            path = self._artifact_path(self.artifact_id)
            handle = open(path, "rb")  # noqa: SIM115
        except (NotFound, OSError):
            return None
        out: list[bytes] = []
        size = 0
        with handle:
            handle.seek(offset)
            pos = offset
            while pos < self._file_end:
                line = handle.readline(self._file_end - pos)
                if not line:
                    break
                pos += len(line)
                if line_seq(line) < nxt:
                    continue
                if out and size + len(line) > max_bytes:
                    break
                out.append(line)
                size += len(line)
        return out
