"""Image displays: a one-line description, and saving them to files (``--save-images``)."""

from __future__ import annotations

import base64
import binascii
import mimetypes
import struct
from pathlib import Path
from typing import Any

from ...text import human_size

EXTENSIONS = {"image/png": ".png", "image/jpeg": ".jpg", "image/gif": ".gif", "image/svg+xml": ".svg"}


def image_bytes(display: dict[str, Any]) -> bytes:
    """The image's bytes: base64 data decoded, SVG (sent as text) encoded."""
    data = display.get("data") or ""
    if not isinstance(data, str):
        return b""
    if display.get("mime") == "image/svg+xml":
        return data.encode("utf-8")
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return b""


def _dimensions(mime: str, data: bytes) -> tuple[int, int] | None:
    if mime == "image/png" and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    if mime == "image/gif" and data[:4] == b"GIF8" and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return int(width), int(height)
    return None


def describe(display: dict[str, Any], saved: Path | None = None) -> str:
    """``[image/png 640x480, 23.1 KB]`` and where it was saved, if it was (a placeholder without its data,
    as a notebook run gives images: its size only)."""
    mime = str(display.get("mime") or "image")
    data = image_bytes(display)
    dims = _dimensions(mime, data)
    nbytes = len(data) if "data" in display or not isinstance(display.get("bytes"), int) else display["bytes"]
    size = f"{dims[0]}x{dims[1]}, {human_size(nbytes)}" if dims else human_size(nbytes)
    where = f" saved to {saved}" if saved is not None else ""
    return f"[{mime} {size}]{where}"


def save(display: dict[str, Any], directory: Path, cell_index: int, number: int) -> Path:
    """Write the image to ``directory/cell<i>-<n>.<ext>`` (never over an existing file)."""
    mime = str(display.get("mime") or "")
    ext = EXTENSIONS.get(mime) or mimetypes.guess_extension(mime) or ".bin"
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"cell{cell_index + 1}-{number}"
    path = directory / f"{stem}{ext}"
    suffix = 1
    while path.exists():
        suffix += 1
        path = directory / f"{stem}-{suffix}{ext}"
    path.write_bytes(image_bytes(display))
    return path


class Saver:
    """Saves a run's image displays to a directory, numbering them per cell."""

    def __init__(self, directory: Path | None):
        self.directory = directory
        self._counts: dict[int, int] = {}

    def __call__(self, cell_index: int, display: dict[str, Any]) -> Path | None:
        if self.directory is None or display.get("type") != "image":
            return None
        self._counts[cell_index] = self._counts.get(cell_index, 0) + 1
        return save(display, self.directory, cell_index, self._counts[cell_index])
