"""The output sink's memory stays bounded however much a cell prints: 28 MB through it under tracemalloc,
in phases, and no phase holds more than the first.

Not in the quick tier (tests/test_sink.py is): tracing every allocation of the sanitized lines takes seconds.
A leak of any size that grows with the output shows as memory held after a phase that the phase before did
not hold (measured: 64 bytes more per 8 MB, the counters' integers); one that holds it all shows in the peak.
"""

from __future__ import annotations

import hashlib
import itertools
import tracemalloc
from pathlib import Path
from typing import BinaryIO

from jupyter_agent_tools.execution.sink import OutputSink

MB = 1024 * 1024
PHASES_MB = (4, 8, 8, 8)  # the first fills the 50 KB output; the others add only to the artifact


def test_memory_stays_bounded_and_does_not_grow_with_the_output(tmp_path: Path) -> None:
    path = tmp_path / "artifact.txt"
    # colored log lines with a progress redraw, multibyte text, a tab; every line needs sanitizing
    unit_raw = "step  50%\r\x1b[1mstep 100%\x1b[0m é日🎉\tloss=0.25 " + "." * 60 + "\n"
    unit_clean = "step 100% é日🎉\tloss=0.25 " + "." * 60 + "\n"
    repeat = 64 * 1024 // len(unit_raw)
    chunk = unit_raw * repeat
    clean_chunk = unit_clean * repeat

    def opener() -> tuple[str, BinaryIO]:
        return "big", path.open("wb")

    sink = OutputSink(50 * 1024, opener)
    held: list[int] = []  # traced bytes at the end of each phase
    peaks: list[int] = []  # and the most during it
    count = 0
    tracemalloc.start()
    try:
        for megabytes in PHASES_MB:
            tracemalloc.reset_peak()
            for _ in range(megabytes * MB // len(chunk)):
                sink.push(chunk)
                count += 1
            current, peak = tracemalloc.get_traced_memory()
            held.append(current)
            peaks.append(peak)
        summary = sink.finish()
    finally:
        tracemalloc.stop()
    assert max(peaks) < 4 * MB, f"peaks {peaks}"
    assert all(later <= peaks[0] + 64 * 1024 for later in peaks[1:]), f"peaks {peaks}"
    assert all(b - a < 4096 for a, b in itertools.pairwise(held)), f"held after each phase {held}"

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
