"""The events of a running eval waiting for a stream client, with a bounded amount of output text (pure).

The executor emits events as fast as the kernel prints; the client takes them as fast as it reads. Text
of ``chunk`` events that would take the text held for the client (waiting, and taken but not yet sent)
past ``max_bytes`` is not queued: the client gets a ``gap`` event saying how many bytes of which cell's
output it skipped. Nothing is lost: the sink keeps the cell's whole output (its tail in the result, all
of it in the artifact once it passed ``max_output_bytes``). Every other event is always queued, in order.
"""

from __future__ import annotations

import sys
from collections import deque

from ..stream_events import Chunk, Gap, StreamEvent

_BLOCK = 1 << 20  # characters measured at a time: a long chunk is never encoded whole just to count it


def utf8_size(text: str) -> int:
    """UTF-8 bytes of ``text``, without encoding it whole."""
    if text.isascii():
        return len(text)
    blocks = range(0, len(text), _BLOCK)
    return sum(len(text[i : i + _BLOCK].encode("utf-8", "surrogatepass")) for i in blocks)


def utf8_prefix(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` with at most ``max_bytes`` UTF-8 bytes."""
    if text.isascii():
        return text[:max_bytes]
    return text[:max_bytes].encode("utf-8", "surrogatepass")[:max_bytes].decode("utf-8", "ignore")


class _Run:
    """Consecutive chunks (or skipped bytes) of one cell and stream, merged when taken."""

    __slots__ = ("index", "kind", "name", "offset", "parts", "size")

    def __init__(self, kind: str, index: int, name: str):
        self.kind = kind  # "chunk" | "gap"
        self.index = index
        self.name = name
        self.parts: deque[str] = deque()
        self.offset = 0  # characters of parts[0] already taken
        self.size = 0  # bytes: the text not yet taken, or the bytes skipped

    def take(self, max_chars: int) -> tuple[Chunk | Gap, int]:
        """An event with (up to ``max_chars`` characters of) what the run holds, and its text's bytes."""
        if self.kind == "gap":
            return {"type": "gap", "index": self.index, "name": self.name, "bytes": self.size}, 0
        pieces: list[str] = []
        while self.parts and max_chars > 0:
            part = self.parts[0]
            piece = part[self.offset : self.offset + max_chars]
            pieces.append(piece)
            max_chars -= len(piece)
            self.offset += len(piece)
            if self.offset == len(part):
                self.parts.popleft()
                self.offset = 0
        text = "".join(pieces)
        size = utf8_size(text)
        self.size -= size
        return {"type": "chunk", "index": self.index, "name": self.name, "text": text}, size


class StreamBacklog:
    """A FIFO of eval events for one stream client; ``put`` never blocks and never grows past the bound."""

    def __init__(self, max_bytes: int):
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self.max_bytes = max_bytes
        self._items: deque[StreamEvent | _Run] = deque()
        self._queued = 0  # text bytes waiting
        self._in_flight = 0  # text bytes taken, not yet sent
        self._closed = False
        self.skipped = 0  # text bytes not sent, over the whole stream

    def __bool__(self) -> bool:
        return bool(self._items)

    def put(self, event: StreamEvent) -> None:
        """Queue an event; a chunk's text only as far as the bound allows, the rest counted as a gap."""
        if self._closed:
            return
        if event["type"] != "chunk":
            self._items.append(event)
            return
        text, index, name = event["text"], event["index"], event["name"]
        size = utf8_size(text)
        room = self.max_bytes - self._queued - self._in_flight
        if size > room:
            head = utf8_prefix(text, room) if room > 0 else ""
            head_size = utf8_size(head)
            if head:
                self._append("chunk", index, name, head, head_size)
            self._append("gap", index, name, "", size - head_size)
            self.skipped += size - head_size
        elif text:
            self._append("chunk", index, name, text, size)

    def _append(self, kind: str, index: int, name: str, text: str, size: int) -> None:
        last = self._items[-1] if self._items else None
        if not (isinstance(last, _Run) and (last.kind, last.index, last.name) == (kind, index, name)):
            last = _Run(kind, index, name)
            self._items.append(last)
        if text:
            last.parts.append(text)
            self._queued += size
        last.size += size

    def take(self, max_chars: int | None = None) -> list[StreamEvent]:
        """The queued events, oldest first, consecutive chunks of a cell's stream merged into one; with
        ``max_chars``, only about that much text (a chunk may be split; the rest stays queued).

        Their text counts against the bound until :meth:`sent`.
        """
        budget = max_chars if max_chars is not None else sys.maxsize
        events: list[StreamEvent] = []
        while self._items:
            item = self._items[0]
            if not isinstance(item, _Run):
                events.append(item)
                self._items.popleft()
                continue
            if item.kind == "chunk" and budget <= 0:
                break
            event, size = item.take(budget)
            events.append(event)
            self._queued -= size
            self._in_flight += size
            if event["type"] == "chunk":
                budget -= len(event["text"])
            if item.kind == "gap" or not item.parts:
                self._items.popleft()
        return events

    def lagging(self) -> bool:
        """Whether the client is behind: less than a quarter of the bound is left for new text."""
        return not self._closed and (self.max_bytes - self._queued - self._in_flight) * 4 < self.max_bytes

    def sent(self) -> None:
        """The events taken so far have been sent: their text no longer counts."""
        self._in_flight = 0

    def close(self) -> None:
        """The client is gone: drop what is queued and every later event."""
        self._closed = True
        self._items.clear()
        self._queued = self._in_flight = 0
