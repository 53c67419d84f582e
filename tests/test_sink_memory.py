"""The output sink's memory stays bounded however much a cell prints: 100 MB through it under tracemalloc.

Not in the quick tier (tests/test_sink.py is): tracing every allocation of 100 MB of sanitized lines takes
tens of seconds on a loaded machine, and a smaller flood would prove less.
"""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path
from typing import BinaryIO

from jupyter_agent_tools.execution.sink import OutputSink


def test_memory_stays_bounded_for_100_mb(tmp_path: Path) -> None:
    path = tmp_path / "artifact.txt"
    # colored log lines with a progress redraw, multibyte text, a tab; every line needs sanitizing
    unit_raw = "step  50%\r\x1b[1mstep 100%\x1b[0m é日🎉\tloss=0.25 " + "." * 60 + "\n"
    unit_clean = "step 100% é日🎉\tloss=0.25 " + "." * 60 + "\n"
    repeat = 64 * 1024 // len(unit_raw)
    chunk = unit_raw * repeat
    clean_chunk = unit_clean * repeat
    count = 100 * 1024 * 1024 // len(chunk)

    def opener() -> tuple[str, BinaryIO]:
        return "big", path.open("wb")

    sink = OutputSink(50 * 1024, opener)
    tracemalloc.start()
    try:
        for _ in range(count):
            sink.push(chunk)
        summary = sink.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, f"peak {peak} bytes"

    expected = hashlib.sha256()
    clean_bytes = clean_chunk.encode("utf-8")
    for _ in range(count):
        expected.update(clean_bytes)
    actual = hashlib.sha256()
    with path.open("rb") as artifact:
        for block in iter(lambda: artifact.read(1 << 20), b""):
            actual.update(block)
    assert actual.hexdigest() == expected.hexdigest()
    assert summary.total_bytes == len(clean_bytes) * count == path.stat().st_size
    assert summary.total_lines == repeat * count
    assert summary.artifact_id == "big"
    assert summary.output_bytes <= 50 * 1024
    assert summary.output.partition("\n")[2] == unit_clean * (summary.output_lines)
