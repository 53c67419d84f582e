"""Bounded eval output: sanitize each chunk, keep the tail in memory, spill the full stream to an artifact.

The sink sees raw stream text chunk by chunk and returns the sanitized text to show now. Two things are
held back until the next chunk decides them: an escape sequence cut by the chunk boundary (``"\\x1b[3"`` +
``"1mred"``) and the unfinished line when it contains ``\\r`` (a progress bar being redrawn). Neither is ever
held back beyond ``max_bytes``. A partial line without ``\\r`` is streamed at once; a ``\\r`` that arrives
after it on the same line cannot take it back.

Memory stays near ``2 * max_bytes`` however much is pushed: once the stream passes ``max_bytes`` the sink
opens an artifact, writes everything so far, appends every later chunk to it, and keeps only the tail.
That artifact is a :class:`Spill`, which a notebook run's stored outputs use too. When the artifact
store's cap cuts the artifact, the notice says so and how much it holds.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..artifacts import ArtifactFile, ArtifactFull, ArtifactOpener
from ..text import (
    ASCII_CONTROLS,
    resolve_carriage_returns,
    split_incomplete_escape,
    strip_ansi,
    strip_controls,
)

_NEWLINE = 0x0A
# Long text is encoded, counted and written in blocks of this many characters: one print of 100 MB then
# costs a few 1 MB buffers instead of full-size copies (which the allocator may keep as resident memory).
_BLOCK = 1 << 20


@dataclass
class SinkSummary:
    """What a finished stream looks like to a model."""

    output: str  # visible text: everything if it fit, else a notice line plus the tail
    truncated: bool
    total_bytes: int  # UTF-8 bytes of the full sanitized stream
    total_lines: int
    output_bytes: int  # UTF-8 bytes of the visible text, without the notice
    output_lines: int
    artifact_id: str | None


class Spill:
    """An artifact written as output arrives: opened at the first write, appended to, closed at the end.

    A failed open or write drops it (``artifact_id`` becomes None), and so does a write after
    :meth:`close`: an incomplete copy would mislead. A write the artifact store's cap cuts keeps what fit
    (``kept`` says how many bytes; later writes are ignored), for a caller that says so; one that saves all
    or nothing calls :meth:`discard`. :meth:`restart` empties it to be written again.
    """

    def __init__(self, open_artifact: ArtifactOpener | None) -> None:
        self._open_artifact = open_artifact
        self.artifact_id: str | None = None
        self.kept: int | None = None  # bytes the artifact holds once the store's cap cut it
        self._file: ArtifactFile | None = None
        self._failed = open_artifact is None
        self._closed = False
        self._discard_cut: ArtifactFull | None = None

    def write(self, data: bytes | bytearray) -> None:
        """Append ``data`` (opening the artifact first if needed)."""
        if self._failed or not data or self.kept is not None:
            return
        if self._closed:
            self._fail()  # closed early: the artifact misses this data
            return
        if self._file is None:
            assert self._open_artifact is not None
            try:
                self.artifact_id, self._file = self._open_artifact()
            except OSError:
                self._fail()
                return
        try:
            self._file.write(data)
        except ArtifactFull as full:
            self.kept, self._discard_cut = full.kept, full
            self.close()
        except OSError:
            self._fail()

    def discard(self) -> None:
        """Remove an artifact the cap cut (all or nothing); it no longer has an id."""
        if self._discard_cut is not None:
            self._discard_cut.discard()
        self.artifact_id, self._discard_cut = None, None

    def write_text(self, text: str, errors: str = "strict") -> None:
        """Append ``text`` as UTF-8, encoded a block at a time (no full-size copy of a long text)."""
        for start in range(0, len(text), _BLOCK):
            self.write(text[start : start + _BLOCK].encode("utf-8", errors))

    def restart(self) -> None:
        """Empty the artifact (what it held was cleared); the next write starts it again."""
        restart = getattr(self._file, "restart", None)  # ArtifactWriter's: counted by the store's cap
        if callable(restart):
            try:
                restart()
                return
            except OSError:
                self.close()
        elif self._file is not None:
            try:  # a plain binary file
                self._file.seek(0)  # type: ignore[attr-defined]
                self._file.truncate()  # type: ignore[attr-defined]
                return
            except (OSError, AttributeError):
                self.close()  # a file that cannot start over: the next write opens another
        self.discard()  # a cut artifact's first bytes are no use to anyone now
        self.artifact_id, self._file, self.kept, self._discard_cut = None, None, None, None
        self._failed = self._open_artifact is None
        self._closed = False

    def close(self) -> None:
        """Close the artifact file if it is open (idempotent); it keeps its id."""
        self._closed = True
        handle, self._file = self._file, None
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()

    def _fail(self) -> None:
        self.artifact_id = None
        self._failed = True
        self.close()


def compact_line(line: str) -> str:
    """Shrink an unfinished line holding ``\\r`` to what still matters for its resolution.

    ``resolve_carriage_returns`` keeps the last non-empty ``\\r``-separated segment, so earlier segments can
    go; the leading ``\\r`` keeps the next chunk's text appending to the right segment.
    """
    segments = line.split("\r")
    if segments[-1]:
        return "\r" + segments[-1]
    last = next((s for s in reversed(segments) if s), "")
    return "\r" + last + "\r" if last else "\r"


class OutputSink:
    """Sanitizes streamed output, counts it, keeps the tail within ``max_bytes`` (the value of
    ``CellExecutor.max_output_bytes``) and spills the rest."""

    def __init__(self, max_bytes: int, open_artifact: ArtifactOpener | None = None) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self.max_bytes = max_bytes
        self._open_artifact = open_artifact
        self._escape = ""  # raw escape sequence cut by the chunk boundary
        self._line = ""  # cleaned unfinished line that holds a \r, compacted
        self._buf = bytearray()  # the whole stream until truncation, then a tail of it
        self._buf_at_line_start = True  # whether _buf begins at a line start
        self._total_bytes = 0
        self._newlines = 0
        self._ends_with_newline = False
        self._truncated = False
        self._spill = Spill(open_artifact)
        self._summary: SinkSummary | None = None

    def push(self, text: str) -> str:
        """Sanitize one raw chunk, account it, and return the sanitized text to stream now (may be '')."""
        if self._summary is not None:
            raise RuntimeError("push() after finish()")
        if not text:
            return ""
        head, escape = split_incomplete_escape(self._escape + text)
        if self._too_big(escape):
            head, escape = head + escape, ""  # strip_ansi removes the unfinished sequence
        self._escape = escape
        plain = strip_ansi(head)
        if len(plain) > _BLOCK and plain.isascii() and not self._line and "\r" not in plain:
            return self._push_ascii(plain)
        out = self._settle(strip_controls(plain))
        self._account(out)
        return out

    def _push_ascii(self, text: str) -> str:
        """:meth:`push` of a long ASCII text without ``\r``: each block's bytes are encoded once, for
        the control check and the accounting alike (a 100 MB print: three passes over it, not five)."""
        cleaned: list[str] | None = None  # the blocks as kept, once one of them had controls
        for start in range(0, len(text), _BLOCK):
            data = text[start : start + _BLOCK].encode("ascii")
            kept = data.translate(None, ASCII_CONTROLS)
            if len(kept) != len(data) and cleaned is None:
                cleaned = [text[:start]]
            if cleaned is not None:
                cleaned.append(kept.decode("ascii"))
            self._account_bytes(kept)
        return text if cleaned is None else "".join(cleaned)

    def flush(self) -> str:
        """Release and return what is held back, as at the end of the stream (``finish`` calls this)."""
        if self._summary is not None:
            return ""
        line = self._line + strip_controls(strip_ansi(self._escape))
        self._escape = self._line = ""
        out = resolve_carriage_returns(line)
        self._account(out)
        return out

    def finish(self) -> SinkSummary:
        """Flush held-back text, close the artifact and summarize the stream (idempotent)."""
        if self._summary is not None:
            return self._summary
        self.flush()
        self.close()
        total_lines = self._newlines + (1 if self._total_bytes and not self._ends_with_newline else 0)
        if not self._truncated:
            self._summary = SinkSummary(
                output=self._buf.decode("utf-8"),
                truncated=False,
                total_bytes=self._total_bytes,
                total_lines=total_lines,
                output_bytes=self._total_bytes,
                output_lines=total_lines,
                artifact_id=None,
            )
            return self._summary
        start = self._tail_start()
        visible = self._buf[start:].decode("utf-8")
        # the newlines counted but those still in the buffer came before it
        first_line = self._newlines - self._buf.count(b"\n", start) + 1
        shown = f"lines {first_line}-{total_lines} of {total_lines}"
        limit = f"{self.max_bytes / 1024:.1f}KB limit"
        spill = self._spill
        if spill.artifact_id is not None and spill.kept is not None:
            notice = (
                f"[Showing {shown} ({limit}). Incomplete: artifact://{spill.artifact_id} holds only the "
                f"first {spill.kept} of {self._total_bytes} bytes (cut at the artifacts' cap, "
                "ArtifactStore.max_bytes)]\n"
            )
        elif spill.artifact_id is not None:
            notice = f"[Showing {shown} ({limit}). Full: artifact://{spill.artifact_id}]\n"
        else:
            notice = f"[Showing {shown} ({limit})]\n"
        self._summary = SinkSummary(
            output=notice + visible,
            truncated=True,
            total_bytes=self._total_bytes,
            total_lines=total_lines,
            output_bytes=len(self._buf) - start,
            output_lines=total_lines - first_line + 1 if visible else 0,
            artifact_id=self._spill.artifact_id,
        )
        return self._summary

    def spill(self, text: str) -> str | None:
        """Save ``text`` as an artifact of its own (an output too large to show); its id, or None.

        Touches no state of the sink, so it may run in another thread.
        """
        spill = Spill(self._open_artifact)
        spill.write_text(text, "replace")
        spill.close()
        if spill.kept is not None:
            spill.discard()  # the caller says the artifact holds the whole text: a cut one would mislead
        return spill.artifact_id

    def close(self) -> None:
        """Close the artifact file if it is open (idempotent)."""
        self._spill.close()

    def _too_big(self, text: str) -> bool:
        """Whether ``text`` is over ``max_bytes`` in UTF-8 (cheap for short text)."""
        return len(text) * 4 > self.max_bytes and len(text.encode("utf-8", "surrogatepass")) > self.max_bytes

    def _settle(self, clean: str) -> str:
        """Resolve ``\\r`` in finished lines; hold back an unfinished line that holds a ``\\r``."""
        if not self._line and "\r" not in clean:
            return clean
        if self._line:
            clean, self._line = self._line + clean, ""
        newline = clean.rfind("\n")
        done = resolve_carriage_returns(clean[: newline + 1])
        rest = clean[newline + 1 :]
        if "\r" not in rest:
            return done + rest
        rest = compact_line(rest)
        if self._too_big(rest):
            return done + resolve_carriage_returns(rest)
        self._line = rest
        return done

    def _account(self, out: str) -> None:
        """Count ``out``, append it to the tail buffer and the artifact, and keep the buffer bounded."""
        if len(out) <= _BLOCK:
            self._account_bytes(out.encode("utf-8"))
            return
        for start in range(0, len(out), _BLOCK):
            self._account_bytes(out[start : start + _BLOCK].encode("utf-8"))

    def _account_bytes(self, data: bytes) -> None:
        if not data:
            return
        self._total_bytes += len(data)
        self._newlines += data.count(b"\n")
        self._ends_with_newline = data.endswith(b"\n")
        if self._truncated:
            self._spill.write(data)
        elif self._total_bytes > self.max_bytes:
            self._truncated = True
            self._spill.write(self._buf)  # the whole stream so far: the buffer, then this data
            self._spill.write(data)
        if len(self._buf) + len(data) <= 2 * self.max_bytes:
            self._buf += data
            return
        # keep the last max_bytes
        kept = self.max_bytes
        if len(data) >= kept:  # the buffer is replaced: a big chunk is not copied in whole
            self._buf = self._buf[-1:] + data[-kept - 1 :]  # with the byte before what is kept
        else:
            self._buf += data
        cut = len(self._buf) - kept
        self._buf_at_line_start = self._buf[cut - 1] == _NEWLINE
        del self._buf[:cut]

    def _tail_start(self) -> int:
        """Where the visible tail begins in ``_buf``: at most ``max_bytes`` back, on a character boundary,
        and on a line start when one is inside the tail."""
        buf = self._buf
        start = max(len(buf) - self.max_bytes, 0)
        while start < len(buf) and buf[start] & 0xC0 == 0x80:  # UTF-8 continuation byte
            start += 1
        at_line_start = buf[start - 1] == _NEWLINE if start else self._buf_at_line_start
        if not at_line_start:
            newline = buf.find(b"\n", start)
            if newline != -1 and newline + 1 < len(buf):
                start = newline + 1
        return start
