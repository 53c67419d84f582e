"""A code cell's outputs built from the kernel's iopub messages, as JupyterLab stores them.

- ``stream``: consecutive chunks of one stream are merged into one output; ``\\r`` overwrites are
  resolved the way a notebook shows them;
- ``execute_result`` (with its ``execution_count``), ``display_data``: every MIME type of the bundle,
  images kept as base64;
- ``update_display_data`` replaces the outputs that showed the same ``display_id``;
- ``clear_output`` clears at once, or with ``wait=True`` when the next output arrives;
- ``error``: ``ename``/``evalue``/``traceback`` exactly as the kernel sent them.

Text is stored split into lines as nbformat writes it (``str.splitlines(keepends=True)``).

What a flood can cost is bounded twice. One output's text by ``max_text_bytes``: past it the head is kept
with a note and the whole text goes to an artifact as it arrives. All the outputs a cell stores, by
``max_bytes`` (every kind together, images included; each output counts at least
:data:`OUTPUT_OVERHEAD`): the first output that does not fit and every output after it are left out of the
cell and written to one artifact as they arrive (one JSON output per line), and one placeholder output
at the end says how many outputs and bytes were left out and where they are. Only what is stored counts:
``clear_output`` empties the cell and starts its artifact over. So memory stays within about
``max_bytes`` and one message, whatever the kernel sends. Artifacts are written through the
:class:`~..execution.sink.Spill` eval's output uses; the caller gives the way to open one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from ..artifacts import ArtifactOpener
from ..execution.messages import Bundle, Cleared, Input, Iopub, Raised, Stream
from ..execution.sink import Spill, compact_line
from ..text import human_size, resolve_carriage_returns

SPLIT_MIMES = ("application/javascript", "image/svg+xml")  # nbformat splits these besides text/*
TEXT_MIMES_TO_BOUND = ("text/plain", "text/html", "text/markdown", "text/latex")
# What one output costs in the file besides its data (its keys, as nbformat indents them): with it, a
# flood of empty outputs is bounded too.
OUTPUT_OVERHEAD = 100
NOTE_BYTES = 160  # about the size of a truncation note
MAX_OMITTED_DISPLAY_IDS = 10_000  # display ids of left-out outputs whose updates go to the artifact too
_BLOCK = 1 << 20  # characters of a long string escaped at a time


def split_text(text: str) -> list[str]:
    """Text as nbformat stores it in a file: lines, each keeping its newline."""
    return text.splitlines(keepends=True)


def split_bundle(data: dict[str, Any]) -> dict[str, Any]:
    """A MIME bundle with its multi-line text values split into lines, as nbformat writes them."""
    out: dict[str, Any] = {}
    for mime, value in data.items():
        if isinstance(value, str) and (mime.startswith("text/") or mime in SPLIT_MIMES):
            out[mime] = split_text(value)
        else:
            out[mime] = value
    return out


def _join(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    return None


def _nbytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _value_bytes(value: Any) -> int:
    text = _join(value)
    if text is not None:
        return _nbytes(text)
    return len(json.dumps(value, ensure_ascii=False))


def _data_bytes(output: dict[str, Any]) -> int:
    """The bytes of what an output shows: its bundle's values, or an error's texts."""
    if output["output_type"] == "error":
        return sum(_nbytes(text) for text in [output["ename"], output["evalue"], *output["traceback"]])
    return sum(_value_bytes(value) for value in output["data"].values())


def _prefix(text: str, nbytes: int) -> str:
    """The longest start of ``text`` within ``nbytes`` UTF-8 bytes."""
    if text.isascii():
        return text[: max(0, nbytes)]
    return text.encode("utf-8", "surrogatepass")[: max(0, nbytes)].decode("utf-8", "ignore")


def _head(text: str, nbytes: int) -> str:
    """What a truncated text keeps: its start within ``nbytes``, cut after a line when there is one."""
    head = _prefix(text, nbytes)
    return head[: head.rfind("\n") + 1 or len(head)]


def _note(head: str, total: int, limit: str, artifact_id: str | None, kept: int | None = None) -> str:
    where = f" Full output: artifact {artifact_id}." if artifact_id else ""
    if artifact_id and kept is not None:
        where = f" Artifact {artifact_id} holds only its first {kept} bytes (ArtifactStore.max_bytes)."
    note = f"[Output truncated: showing {_nbytes(head)} of {total} bytes ({limit}).{where}]\n"
    return head + ("" if head.endswith("\n") or not head else "\n") + note


@dataclass
class _Stream:
    """One stream output: the finished text it keeps, its unfinished last line, its spill once cut."""

    name: str
    parts: list[str] = field(default_factory=list)  # kept text (finished lines, carriage returns resolved)
    kept: int = 0  # UTF-8 bytes of parts
    line: str = ""  # the unfinished last line as sent ("\r" resolved when it ends), compacted
    total: int = 0  # UTF-8 bytes of all its finished text
    spill: Spill | None = None  # the whole text, once it did not fit
    limit: str = ""  # the setting that cut it


@dataclass
class _Kept:
    """A stored output other than a stream, and what it costs in the cell."""

    output: dict[str, Any]
    size: int


@dataclass
class CellOutputs:
    """The outputs of one running cell; :meth:`add` each iopub message, :meth:`close` at the end, and
    :meth:`to_nbformat` for what the notebook stores (at any time)."""

    max_text_bytes: int = 256 * 1024
    open_artifact: ArtifactOpener | None = None
    max_bytes: int = 4 * 1024 * 1024  # 0: no limit on the cell
    execution_count: int | None = None
    _items: list[_Kept | _Stream] = field(default_factory=list)
    _used: int = 0  # what the stored items cost
    _display_ids: dict[str, list[int]] = field(default_factory=dict)
    _clear_pending: bool = False
    # Left out since the cell was last cleared: outputs, display updates, their bytes, where they went.
    _omitting: bool = False
    _omitted_outputs: int = 0
    _omitted_updates: int = 0
    _omitted_bytes: int = 0
    _omitted_stream: str | None = None  # the stream the last left-out chunk belonged to
    _omitted_ids: set[str] = field(default_factory=set)
    _omitted: Spill | None = None
    _spare: list[Spill] = field(default_factory=list)  # stream spills of cleared outputs, reused

    def add(self, read: Iopub | None) -> bool:
        """Take one iopub message of this cell (as :func:`~..execution.messages.read_iopub` read it);
        True if what the cell stores changed."""
        if isinstance(read, Input):
            if read.execution_count is not None:
                self.execution_count = read.execution_count
            return False
        if isinstance(read, Cleared):
            if read.wait:
                self._clear_pending = True
                return False
            return self._clear()
        if isinstance(read, Bundle) and read.msg_type == "update_display_data":
            return self._update(read)
        if not isinstance(read, (Stream, Bundle, Raised)):
            return False
        if self._clear_pending:
            self._clear()
        if isinstance(read, Stream):
            self._stream(read.name, read.text)
            return True
        output = read.to_nbformat(self.execution_count)
        size = self._cost(output)
        self._end_stream()
        display_id = read.display_id if isinstance(read, Bundle) else None
        if self._omitting or (self.max_bytes and self._used + size > self.max_bytes):
            self._omit(output, _data_bytes(output))
            if display_id is not None and len(self._omitted_ids) < MAX_OMITTED_DISPLAY_IDS:
                self._omitted_ids.add(display_id)
            return True
        if "data" in output:
            output["data"] = self._bounded(output["data"])
        if display_id is not None:
            self._display_ids.setdefault(display_id, []).append(len(self._items))
        self._items.append(_Kept(output, size))
        self._used += size
        return True

    def close(self) -> None:
        """The cell ended: its last line is final, artifacts are closed (idempotent)."""
        self._end_stream()
        for spill in (self._omitted, *self._spare):
            if spill is not None:
                spill.close()

    def omitted(self) -> dict[str, Any] | None:
        """What the cell does not store (``max_bytes``): counts, bytes and the artifact; None if nothing."""
        if not (self._omitted_outputs or self._omitted_updates):
            return None
        return {
            "outputs": self._omitted_outputs,
            "updates": self._omitted_updates,
            "bytes": self._omitted_bytes,
            "artifact_id": self._omitted.artifact_id if self._omitted is not None else None,
        }

    def to_nbformat(self) -> list[dict[str, Any]]:
        """The outputs as nbformat v4 dicts, text split into lines (new objects each call)."""
        result: list[dict[str, Any]] = []
        for item in self._items:
            if isinstance(item, _Stream):
                text = "".join(item.parts)
                if item.spill is None:
                    text += resolve_carriage_returns(item.line)
                else:
                    spill = item.spill
                    total = item.total + _nbytes(item.line)
                    text = _note(text, total, item.limit, spill.artifact_id, spill.kept)
                result.append({"output_type": "stream", "name": item.name, "text": split_text(text)})
                continue
            output = copy.deepcopy(item.output)
            if "data" in output:
                output["data"] = split_bundle(output["data"])
            result.append(output)
        omitted = self.omitted()
        if omitted is not None:
            result.append(self._placeholder(omitted))
        return result

    # -- streams ---------------------------------------------------------------------------------

    def _stream(self, name: str, text: str) -> None:
        last = self._items[-1] if self._items and not self._omitting else None
        if isinstance(last, _Stream) and last.name == name:
            self._feed(last, text)
            return
        self._end_stream()
        if self._omitting or (self.max_bytes and self._used + OUTPUT_OVERHEAD >= self.max_bytes):
            self._omit({"output_type": "stream", "name": name, "text": text}, _nbytes(text), name)
            return
        stream = _Stream(name)
        self._items.append(stream)
        self._used += OUTPUT_OVERHEAD
        self._feed(stream, text)

    def _feed(self, stream: _Stream, text: str) -> None:
        """Add a chunk: its finished lines are kept (or spilled), its unfinished line waits."""
        text = stream.line + text
        end = text.rfind("\n") + 1
        done, rest = text[:end], text[end:]
        if "\r" in rest:
            rest = compact_line(rest)  # only its last segment can still show
        if len(rest) > self.max_text_bytes:
            # A line this long is taken as written so far, so memory stays bounded; a "\r" that comes
            # later on the same line can no longer overwrite it.
            done, rest = done + rest, ""
        stream.line = rest
        if done:
            self._keep(stream, resolve_carriage_returns(done))

    def _keep(self, stream: _Stream, text: str) -> None:
        nbytes = _nbytes(text)
        stream.total += nbytes
        if stream.spill is not None:
            stream.spill.write_text(text, "replace")
            return
        room = self.max_text_bytes
        limit = "NotebookRunner.max_output_bytes_stored"
        if self.max_bytes:
            cell_room = self.max_bytes - (self._used - stream.kept) - NOTE_BYTES
            if cell_room < room:
                room, limit = max(0, cell_room), "NotebookRunner.max_cell_bytes_stored"
        if stream.kept + nbytes <= room:
            stream.parts.append(text)
            stream.kept += nbytes
            self._used += nbytes
            return
        kept = "".join(stream.parts)
        head = _head(kept + _prefix(text, room - stream.kept), room)
        stream.spill = self._spare.pop() if self._spare else Spill(self.open_artifact)
        stream.spill.write_text(kept, "replace")
        stream.spill.write_text(text, "replace")
        stream.parts, stream.limit = [head], limit
        self._used += _nbytes(head) + NOTE_BYTES - stream.kept
        stream.kept = _nbytes(head)

    def _end_stream(self) -> None:
        """The last stream output is over (another output follows): its last line is final."""
        last = self._items[-1] if self._items else None
        if isinstance(last, _Stream):
            line, last.line = last.line, ""
            if line:
                self._keep(last, resolve_carriage_returns(line))
            if last.spill is not None:
                last.spill.close()

    # -- displays --------------------------------------------------------------------------------

    def _cost(self, output: dict[str, Any]) -> int:
        """What ``output`` costs in the cell as it would be stored (long texts cut)."""
        if output["output_type"] == "error":
            return OUTPUT_OVERHEAD + _data_bytes(output)
        size = OUTPUT_OVERHEAD
        for mime, value in output["data"].items():
            nbytes = _value_bytes(value)
            if mime in TEXT_MIMES_TO_BOUND and nbytes > self.max_text_bytes:
                nbytes = self.max_text_bytes + NOTE_BYTES
            size += len(mime) + nbytes
        if output["metadata"]:
            size += len(json.dumps(output["metadata"], ensure_ascii=False))
        return size

    def _bounded(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` with each long text cut to its head and a note; the whole text is an artifact."""
        for mime in TEXT_MIMES_TO_BOUND:
            value = _join(data.get(mime))
            if value is None:
                continue
            data[mime] = value
            nbytes = _nbytes(value)
            if nbytes > self.max_text_bytes:
                spill = Spill(self.open_artifact)
                spill.write_text(value, "replace")
                spill.close()
                if spill.kept is not None:
                    spill.discard()  # the note would promise the whole output
                head = _head(value, self.max_text_bytes)
                data[mime] = _note(head, nbytes, "NotebookRunner.max_output_bytes_stored", spill.artifact_id)
        return data

    def _update(self, read: Bundle) -> bool:
        display_id = read.display_id
        if display_id is None:
            return False
        update = read.to_nbformat()
        indices = self._display_ids.get(display_id, [])
        changed = False
        if indices:
            size = self._cost(update)
            data: dict[str, Any] | None = None
            note: dict[str, Any] | None = None
            for index in indices:
                item = self._items[index]
                assert isinstance(item, _Kept)
                if not self.max_bytes or self._used - item.size + size <= self.max_bytes:
                    if data is None:
                        data = self._bounded(dict(update["data"]))
                    item.output["data"], item.output["metadata"] = data, update["metadata"]
                    self._used += size - item.size
                    item.size = size
                else:  # the update does not fit: the display says where it is
                    if note is None:
                        note = self._update_note(display_id, update, _data_bytes(update))
                    kept = _Kept({**item.output, "data": dict(note), "metadata": {}}, 0)
                    kept.size = self._cost(kept.output)
                    self._used += kept.size - item.size
                    self._items[index] = kept
                changed = True
        if display_id in self._omitted_ids:
            self._omit_update(display_id, update, _data_bytes(update))
            changed = True
        return changed

    # -- what is left out ------------------------------------------------------------------------

    def _omit(self, output: dict[str, Any], nbytes: int, stream: str | None = None) -> None:
        """Leave ``output`` out of the cell: append it to the artifact and count it (a chunk of the
        stream left out just before is part of the same output)."""
        continued = stream is not None and self._omitting and self._omitted_stream == stream
        self._omitting = True
        self._omitted_stream = stream
        self._omitted_outputs += 0 if continued else 1
        self._omitted_bytes += nbytes
        self._write_omitted(output)

    def _omit_update(self, display_id: str, update: dict[str, Any], nbytes: int) -> None:
        self._omitted_updates += 1
        self._omitted_bytes += nbytes
        self._write_omitted({**update, "output_type": "update_display_data", "display_id": display_id})

    def _update_note(self, display_id: str, update: dict[str, Any], nbytes: int) -> dict[str, Any]:
        """Leave out an update that does not fit; the bundle a display shows instead."""
        self._omit_update(display_id, update, nbytes)
        artifact_id = self._omitted.artifact_id if self._omitted is not None else None
        where = f"; it is in artifact {artifact_id}" if artifact_id else ""
        text = (
            f"[An update of this display ({human_size(nbytes)}) is not stored in the notebook: this cell's "
            f"outputs reached NotebookRunner.max_cell_bytes_stored{where}.]"
        )
        return {"text/plain": text}

    def _write_omitted(self, record: dict[str, Any]) -> None:
        if self._omitted is None:
            self._omitted = Spill(self.open_artifact)
        for piece in _json_line(record):
            self._omitted.write_text(piece, "replace")

    def _placeholder(self, omitted: dict[str, Any]) -> dict[str, Any]:
        counts = []
        for key, word in (("outputs", "output"), ("updates", "display update")):
            if omitted[key]:
                counts.append(f"{omitted[key]} {word}{'' if omitted[key] == 1 else 's'}")
        artifact_id = omitted["artifact_id"]
        where = (
            f"All of it is in artifact {artifact_id} (one JSON output per line)."
            if artifact_id
            else "It could not be saved."
        )
        text = (
            f"[Not stored in the notebook: {' and '.join(counts)} ({human_size(omitted['bytes'])}); this "
            "cell's outputs reached NotebookRunner.max_cell_bytes_stored "
            f"({human_size(self.max_bytes)}). {where}]\n"
        )
        return {
            "output_type": "display_data",
            "data": {"text/plain": split_text(text)},
            "metadata": {"jupyter_agent_tools": {"omitted": omitted}},
        }

    def _clear(self) -> bool:
        changed = bool(self._items) or self.omitted() is not None
        last = self._items[-1] if self._items else None
        if isinstance(last, _Stream) and last.spill is not None:
            last.spill.restart()  # a redrawn stream (clear, print, clear...) keeps one artifact
            self._spare.append(last.spill)
        self._items.clear()
        self._display_ids.clear()
        self._used = 0
        self._clear_pending = False
        self._omitting = False
        self._omitted_outputs = self._omitted_updates = self._omitted_bytes = 0
        self._omitted_stream = None
        self._omitted_ids.clear()
        if self._omitted is not None:
            self._omitted.restart()
        return changed


def _json_line(record: dict[str, Any]) -> Iterator[str]:
    """``record`` as one line of JSON, in pieces: its long strings (a stream's text, a bundle's values)
    are escaped a block at a time, so an 80 MB image is not copied whole once more."""
    marker = f"\x00{uuid4().hex}:"
    long: dict[str, str] = {}

    def swap(value: Any) -> Any:
        if isinstance(value, str) and len(value) > _BLOCK:
            key = f"{marker}{len(long)}"
            long[json.dumps(key)] = value
            return key
        return value

    skeleton = {key: swap(value) for key, value in record.items()}
    if isinstance(skeleton.get("data"), dict):
        skeleton["data"] = {mime: swap(value) for mime, value in skeleton["data"].items()}
    text = json.dumps(skeleton, ensure_ascii=False)
    for quoted, value in long.items():
        before, _, text = text.partition(quoted)
        yield before + '"'
        for start in range(0, len(value), _BLOCK):
            yield json.dumps(value[start : start + _BLOCK], ensure_ascii=False)[1:-1]
        yield '"'
    yield text + "\n"
