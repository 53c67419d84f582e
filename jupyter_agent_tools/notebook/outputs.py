"""A code cell's outputs built from the kernel's iopub messages, as JupyterLab stores them (pure).

- ``stream``: consecutive chunks of one stream are merged into one output; ``\\r`` overwrites are
  resolved the way a notebook shows them;
- ``execute_result`` (with its ``execution_count``), ``display_data``: every MIME type of the bundle,
  images kept as base64;
- ``update_display_data`` replaces the outputs that showed the same ``display_id``;
- ``clear_output`` clears at once, or with ``wait=True`` when the next output arrives;
- ``error``: ``ename``/``evalue``/``traceback`` exactly as the kernel sent them.

Text is stored split into lines as nbformat writes it (``str.splitlines(keepends=True)``). One output's
text is bounded by ``max_text_bytes``: past it the head is kept with a note and the whole text goes to an
artifact when the caller gives a way to open one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ..artifacts import ArtifactFull, ArtifactOpener
from ..text import resolve_carriage_returns

SPLIT_MIMES = ("application/javascript", "image/svg+xml")  # nbformat splits these besides text/*
TEXT_MIMES_TO_BOUND = ("text/plain", "text/html", "text/markdown", "text/latex")


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


@dataclass
class _Stream:
    name: str
    text: str


@dataclass
class CellOutputs:
    """The outputs of one running cell; :meth:`add` each iopub message, then :meth:`to_nbformat`."""

    max_text_bytes: int = 256 * 1024
    open_artifact: ArtifactOpener | None = None
    execution_count: int | None = None
    truncated: list[dict[str, Any]] = field(default_factory=list)  # {"output": i, "bytes": n, ...}
    _items: list[dict[str, Any] | _Stream] = field(default_factory=list)
    _display_ids: dict[str, list[int]] = field(default_factory=dict)
    _clear_pending: bool = False

    def add(self, msg_type: str, content: dict[str, Any]) -> bool:
        """Take one iopub message of this cell; True if the outputs changed."""
        if msg_type == "execute_input":
            count = content.get("execution_count")
            if isinstance(count, int):
                self.execution_count = count
            return False
        if msg_type == "clear_output":
            if content.get("wait"):
                self._clear_pending = True
                return False
            return self._clear()
        if msg_type == "update_display_data":
            return self._update(content)
        if msg_type not in ("stream", "execute_result", "display_data", "error"):
            return False
        if self._clear_pending:
            self._clear()
        if msg_type == "stream":
            text = _join(content.get("text")) or ""
            name = str(content.get("name") or "stdout")
            last = self._items[-1] if self._items else None
            if isinstance(last, _Stream) and last.name == name:
                last.text += text
            else:
                self._items.append(_Stream(name, text))
            return True
        if msg_type == "error":
            self._items.append(
                {
                    "output_type": "error",
                    "ename": str(content.get("ename") or ""),
                    "evalue": str(content.get("evalue") or ""),
                    "traceback": [line for line in content.get("traceback") or [] if isinstance(line, str)],
                }
            )
            return True
        output: dict[str, Any] = {
            "output_type": msg_type,
            "data": dict(content.get("data") or {}),
            "metadata": dict(content.get("metadata") or {}),
        }
        if msg_type == "execute_result":
            count = content.get("execution_count")
            output["execution_count"] = count if isinstance(count, int) else self.execution_count
        display_id = (content.get("transient") or {}).get("display_id")
        if isinstance(display_id, str):
            self._display_ids.setdefault(display_id, []).append(len(self._items))
        self._items.append(output)
        return True

    def _clear(self) -> bool:
        changed = bool(self._items)
        self._items.clear()
        self._display_ids.clear()
        self._clear_pending = False
        return changed

    def _update(self, content: dict[str, Any]) -> bool:
        display_id = (content.get("transient") or {}).get("display_id")
        changed = False
        for index in self._display_ids.get(display_id, []) if isinstance(display_id, str) else []:
            item = self._items[index]
            if isinstance(item, dict):
                item["data"] = dict(content.get("data") or {})
                item["metadata"] = dict(content.get("metadata") or {})
                changed = True
        return changed

    def to_nbformat(self) -> list[dict[str, Any]]:
        """The outputs as nbformat v4 dicts, text split into lines and bounded (new objects each call)."""
        self.truncated = []
        result: list[dict[str, Any]] = []
        for index, item in enumerate(self._items):
            if isinstance(item, _Stream):
                text = self._bounded(index, resolve_carriage_returns(item.text))
                result.append({"output_type": "stream", "name": item.name, "text": split_text(text)})
            elif item["output_type"] == "error":
                result.append(copy.deepcopy(item))
            else:
                output = copy.deepcopy(item)
                data = output["data"]
                for mime in TEXT_MIMES_TO_BOUND:
                    value = _join(data.get(mime))
                    if value is not None:
                        data[mime] = self._bounded(index, value, mime)
                output["data"] = split_bundle(data)
                result.append(output)
        return result

    def _bounded(self, index: int, text: str, mime: str | None = None) -> str:
        data = text.encode("utf-8", "surrogatepass")
        if self.max_text_bytes <= 0 or len(data) <= self.max_text_bytes:
            return text
        head = data[: self.max_text_bytes].decode("utf-8", "ignore")
        cut = head.rfind("\n") + 1 or len(head)
        head = head[:cut]
        artifact_id = self._spill(data)
        where = f" Full output: artifact {artifact_id}." if artifact_id else ""
        self.truncated.append({"output": index, "mime": mime, "bytes": len(data), "artifact_id": artifact_id})
        note = (
            f"[Output truncated: showing {len(head.encode('utf-8', 'surrogatepass'))} of {len(data)} bytes "
            f"(max_run_output_bytes).{where}]\n"
        )
        return head + ("" if head.endswith("\n") or not head else "\n") + note

    def _spill(self, data: bytes) -> str | None:
        if self.open_artifact is None:
            return None
        try:
            artifact_id, handle = self.open_artifact()
            with handle:
                handle.write(data)
        except ArtifactFull as full:
            full.discard()  # the note would promise the whole output
            return None
        except OSError:
            return None
        return artifact_id
