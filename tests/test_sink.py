"""OutputSink: sanitizing across chunk boundaries, counting, tail truncation, spilling to an artifact."""

from __future__ import annotations

import io
import random
import re
import tracemalloc
from pathlib import Path
from typing import BinaryIO

import pytest

from jupyter_agent_tools.execution.sink import OutputSink, SinkSummary
from jupyter_agent_tools.text import sanitize

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


class Artifacts:
    """An artifact opener that keeps what was written in memory and records calls."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.files: dict[str, _Capture] = {}

    def __call__(self) -> tuple[str, BinaryIO]:
        artifact_id = f"art{len(self.opened) + 1}"
        self.opened.append(artifact_id)
        self.files[artifact_id] = _Capture()
        return artifact_id, self.files[artifact_id]

    def text(self, artifact_id: str) -> str:
        return self.files[artifact_id].data.decode("utf-8")


class _Capture(io.BytesIO):
    """A BytesIO whose content survives close()."""

    data = b""
    was_closed = False

    def close(self) -> None:
        self.data = self.getvalue()
        self.was_closed = True
        super().close()


def run(
    chunks: list[str], max_bytes: int = 50 * 1024, opener: Artifacts | None = None
) -> tuple[str, SinkSummary]:
    sink = OutputSink(max_bytes, opener)
    streamed = "".join(sink.push(chunk) for chunk in chunks)
    streamed += sink.flush()
    return streamed, sink.finish()


# --- sanitizing, within and across chunks ---


def test_progress_bar_in_one_chunk() -> None:
    streamed, summary = run(["10%\r20%\r30%\n"])
    assert streamed == summary.output == "30%\n"


def test_progress_bar_across_chunks_is_held_back() -> None:
    sink = OutputSink(50 * 1024)
    assert sink.push("10%\r") == ""
    assert sink.push("20%\r") == ""
    assert sink.push("30%\n") == "30%\n"
    assert sink.finish().output == "30%\n"


def test_tqdm_style_leading_carriage_returns() -> None:
    sink = OutputSink(50 * 1024)
    assert sink.push("start\n\r  0%|") == "start\n"
    assert sink.push("\r 50%|#") == ""
    assert sink.push("\r100%|##") == ""
    assert sink.push("\n") == "100%|##\n"
    assert sink.finish().output == "start\n100%|##\n"


def test_crlf_split_between_chunks() -> None:
    _, summary = run(["a\r", "\nb\r", "\n"])
    assert summary.output == "a\nb\n"


def test_held_line_flushed_at_finish() -> None:
    sink = OutputSink(50 * 1024)
    assert sink.push("working\r") == ""
    assert sink.push("done") == ""
    assert sink.flush() == "done"
    assert sink.finish().output == "done"


def test_finish_flushes_without_explicit_flush() -> None:
    sink = OutputSink(50 * 1024)
    sink.push("a\n50%\r")
    summary = sink.finish()
    assert summary.output == "a\n50%"
    assert summary.total_lines == 2


def test_partial_line_without_cr_streams_at_once() -> None:
    sink = OutputSink(50 * 1024)
    assert sink.push("....") == "...."
    assert sink.push("..\n") == "..\n"


def test_escape_split_across_chunks() -> None:
    sink = OutputSink(50 * 1024)
    assert sink.push("\x1b[3") == ""
    assert sink.push("1mred\x1b") == "red"
    assert sink.push("[0m plain\n") == " plain\n"
    assert sink.finish().output == "red plain\n"


def test_osc_hyperlink_split_across_chunks() -> None:
    chunks = ["see \x1b]8;;https://exa", "mple.com\x1b", "\\docs\x1b]8;;\x1b", "\\\n"]
    streamed, summary = run(chunks)
    assert streamed == summary.output == "see docs\n"


def test_incomplete_escape_at_end_of_stream_is_dropped() -> None:
    streamed, summary = run(["text\x1b[3"])
    assert streamed == summary.output == "text"


def test_controls_removed_tabs_kept() -> None:
    _, summary = run(["a\x00b\x07c\x08\td\n"])
    assert summary.output == "abc\td\n"


def test_held_back_line_never_exceeds_max_bytes() -> None:
    sink = OutputSink(max_bytes=100)
    out = sink.push("\r" + "x" * 150)
    assert out == "x" * 150


def test_held_back_escape_never_exceeds_max_bytes() -> None:
    sink = OutputSink(max_bytes=100)
    assert sink.push("\x1b]0;" + "t" * 150) == ""  # removed as an unterminated title, not held
    assert sink.push("visible\n") == "visible\n"


def test_long_progress_line_is_compacted_not_released() -> None:
    sink = OutputSink(max_bytes=100)
    for i in range(1000):
        assert sink.push(f"\r{i:4d}/1000") == ""
    assert sink.push("\n") == " 999/1000\n"


def _random_stream(rng: random.Random) -> str:
    """Output whose lines either hold no \\r or start with one (as progress bars write them)."""
    words = ["alpha", "é", "日本", "🎉", "\t", "x" * 7]
    escapes = [
        "\x1b[31m",
        "\x1b[0m",
        "\x1b]0;title\x07",
        "\x1b]8;;http://a\x1b\\",
        "\x1b7",
        "\x9b1m",
        "\x1bPq#\x1b\\",
    ]
    controls = ["\x00", "\x07", "\x08", "\x7f"]
    lines = []
    for _ in range(rng.randrange(1, 30)):
        parts = []
        progress = rng.random() < 0.4
        for _ in range(rng.randrange(0, 8)):
            pick = rng.random()
            pool = words if pick < 0.6 else escapes if pick < 0.85 else controls
            parts.append(("\r" if progress and rng.random() < 0.5 else "") + rng.choice(pool))
        line = "".join(parts)
        if progress:
            line = "\r" + line + ("\r" if rng.random() < 0.3 else "")
        lines.append(line)
    return "\n".join(lines) + ("\n" if rng.random() < 0.5 else "")


@pytest.mark.parametrize("seed", range(300))
def test_chunked_equals_whole(seed: int) -> None:
    rng = random.Random(seed)
    text = _random_stream(rng)
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randrange(0, 12))))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    streamed, summary = run(chunks)
    assert streamed == summary.output == sanitize(text)


@pytest.mark.parametrize("seed", range(60))
def test_truncated_summary_and_artifact_do_not_depend_on_chunk_sizes(seed: int) -> None:
    """Plain text in chunks smaller and larger than the tail buffer (2 x max_bytes) gives the same tail,
    line numbers and artifact as the whole text pushed at once."""
    rng = random.Random(seed)
    pool = ["a", "bc", "\n", "\n\n", "é", "日本", "🎉", "x" * 40, "line\n" * 9, "\t"]
    text = "".join(rng.choice(pool) for _ in range(rng.randrange(0, 400)))
    max_bytes = rng.choice([1, 3, 16, 100])
    cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randrange(0, 30))))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    whole_opener, chunked_opener = Artifacts(), Artifacts()
    _, whole = run([text], max_bytes=max_bytes, opener=whole_opener)
    streamed, chunked = run(chunks, max_bytes=max_bytes, opener=chunked_opener)
    assert chunked == whole
    assert streamed == sanitize(text)
    if whole.truncated:
        assert chunked_opener.text("art1") == whole_opener.text("art1") == sanitize(text)
        notice, _, visible = whole.output.partition("\n")
        first = int(re.search(r"lines (\d+)-", notice).group(1))  # type: ignore[union-attr]
        clean = sanitize(text)
        assert first == clean[: len(clean) - len(visible)].count("\n") + 1  # the tail's own line number


# --- counting ---


@pytest.mark.parametrize(
    ("chunks", "lines", "nbytes"),
    [
        ([], 0, 0),
        ([""], 0, 0),
        (["a\n"], 1, 2),
        (["a\nb"], 2, 3),
        (["a", "\n", "b\n"], 2, 4),
        (["é\n日本\n🎉"], 3, 3 + 7 + 4),
        (["\n\n\n"], 3, 3),
    ],
)
def test_counts(chunks: list[str], lines: int, nbytes: int) -> None:
    _, summary = run(chunks)
    assert (summary.total_lines, summary.total_bytes) == (lines, nbytes)
    assert (summary.output_lines, summary.output_bytes) == (lines, nbytes)
    assert not summary.truncated


def test_empty_output() -> None:
    _, summary = run([], opener=Artifacts())
    assert summary == SinkSummary("", False, 0, 0, 0, 0, None)


def test_counts_are_over_the_sanitized_stream() -> None:
    _, summary = run(["\x1b[31m10%\r100%\x1b[0m\n"])
    assert (summary.total_bytes, summary.total_lines) == (5, 1)


# --- truncation ---


def test_exactly_max_bytes_is_not_truncated() -> None:
    opener = Artifacts()
    _, summary = run(["x" * 99 + "\n"], max_bytes=100, opener=opener)
    assert not summary.truncated
    assert summary.output == "x" * 99 + "\n"
    assert opener.opened == []


def test_notice_with_artifact_and_line_aligned_tail() -> None:
    opener = Artifacts()
    lines = [f"{i:09d}\n" for i in range(1, 5001)]  # 10 bytes each, 50000 bytes
    streamed, summary = run(lines, max_bytes=10 * 1024, opener=opener)
    assert streamed == "".join(lines)
    tail = "".join(lines[3976:])
    assert (
        summary.output == "[Showing lines 3977-5000 of 5000 (10.0KB limit). Full: artifact://art1]\n" + tail
    )
    assert summary.truncated
    assert (summary.total_bytes, summary.total_lines) == (50000, 5000)
    assert (summary.output_bytes, summary.output_lines) == (10240, 1024)
    assert summary.artifact_id == "art1"
    assert opener.opened == ["art1"]
    assert opener.text("art1") == "".join(lines)
    assert opener.files["art1"].was_closed


def test_tail_prefers_a_line_start() -> None:
    lines = [f"{i:09d}\n" for i in range(1, 5001)]
    _, summary = run(lines, max_bytes=10245)  # the raw cut lands in the middle of a line
    notice, _, visible = summary.output.partition("\n")
    assert notice == "[Showing lines 3977-5000 of 5000 (10.0KB limit)]"
    assert visible == "".join(lines[3976:])
    assert summary.output_bytes == 10240
    assert summary.artifact_id is None


def test_default_limit_notice_format() -> None:
    lines = [f"line {i}\n" for i in range(1, 20001)]
    full = "".join(lines)
    _, summary = run(lines, opener=Artifacts())
    notice, _, visible = summary.output.partition("\n")
    first = summary.total_lines - summary.output_lines + 1
    assert notice == f"[Showing lines {first}-20000 of 20000 (50.0KB limit). Full: artifact://art1]"
    assert visible == "".join(lines[first - 1 :])
    assert full.endswith(visible)
    assert len(visible.encode()) <= 50 * 1024


def test_tail_without_trailing_newline_counts_last_line() -> None:
    _, summary = run(["a\n" * 100 + "end"], max_bytes=50)
    assert summary.total_lines == 101
    # the last 50 bytes start on the newline of line 77: the tail moves on to line 78
    assert summary.output == "[Showing lines 78-101 of 101 (0.0KB limit)]\n" + "a\n" * 23 + "end"
    assert (summary.output_lines, summary.output_bytes) == (24, 49)


@pytest.mark.parametrize("char", ["é", "日本", "🎉", "a🎉é日"])
@pytest.mark.parametrize("offset", range(4))
def test_cut_never_breaks_a_multibyte_character(char: str, offset: int) -> None:
    max_bytes = 101
    text = "z" * offset + char * 200  # one long line: the cut cannot move to a line start
    _, summary = run([text[:150], text[150:]], max_bytes=max_bytes)
    notice, _, visible = summary.output.partition("\n")
    assert notice.startswith("[Showing lines 1-1 of 1 ")
    assert text.endswith(visible)
    encoded = visible.encode("utf-8")
    assert max_bytes - 3 <= len(encoded) <= max_bytes
    assert summary.output_bytes == len(encoded)
    assert summary.output_lines == 1


def test_single_huge_line_ending_in_newline_keeps_char_cut() -> None:
    _, summary = run(["y" * 500 + "\n"], max_bytes=100)
    visible = summary.output.partition("\n")[2]
    assert visible == "y" * 99 + "\n"  # the only line start inside the tail is at its very end


def test_artifact_opened_once_and_holds_everything() -> None:
    opener = Artifacts()
    chunks = [f"\x1b[32mrow {i} é日🎉\x1b[0m\r\x1b[32mrow {i} done\x1b[0m\n" for i in range(3000)]
    streamed, summary = run(chunks, max_bytes=1000, opener=opener)
    expected = sanitize("".join(chunks))
    assert streamed == expected
    assert opener.opened == ["art1"]
    assert opener.text("art1") == expected
    assert summary.total_bytes == len(expected.encode())
    assert summary.total_lines == 3000
    assert expected.endswith(summary.output.partition("\n")[2])


def test_artifact_gets_held_back_text_flushed_at_finish() -> None:
    opener = Artifacts()
    streamed, summary = run(["x" * 200 + "\n", "50%\r", "100%"], max_bytes=100, opener=opener)
    assert streamed == "x" * 200 + "\n100%"
    assert opener.text("art1") == streamed
    assert summary.output.endswith("\n100%")


def test_artifact_open_failure_is_not_fatal() -> None:
    def opener() -> tuple[str, BinaryIO]:
        raise OSError("disk full")

    sink = OutputSink(10, opener)
    sink.push("0123456789abcdef\n")
    summary = sink.finish()
    assert summary.truncated
    assert summary.artifact_id is None
    assert "artifact://" not in summary.output


def test_artifact_write_failure_drops_the_artifact() -> None:
    class Broken(io.BytesIO):
        def write(self, data: object) -> int:
            raise OSError("disk full")

    sink = OutputSink(10, lambda: ("art", Broken()))
    sink.push("0123456789abcdef\n")
    summary = sink.finish()
    assert summary.artifact_id is None
    assert summary.output.startswith("[Showing lines 1-1 of 1 (0.0KB limit)]\n")


# --- lifecycle ---


def test_finish_is_idempotent_and_push_after_finish_fails() -> None:
    sink = OutputSink(50 * 1024)
    sink.push("a\n")
    first = sink.finish()
    assert sink.finish() is first
    assert sink.flush() == ""
    with pytest.raises(RuntimeError):
        sink.push("b\n")


def test_close_is_idempotent_and_closes_the_artifact() -> None:
    opener = Artifacts()
    sink = OutputSink(10, opener)
    sink.push("0123456789abcdef\n")
    sink.close()
    sink.close()
    assert opener.files["art1"].was_closed


def test_output_after_early_close_drops_the_incomplete_artifact() -> None:
    opener = Artifacts()
    sink = OutputSink(10, opener)
    sink.push("0123456789abcdef\n")
    sink.close()
    sink.push("more\n")
    summary = sink.finish()
    assert summary.artifact_id is None
    assert "artifact://" not in summary.output


def test_close_then_finish_keeps_a_complete_artifact() -> None:
    opener = Artifacts()
    sink = OutputSink(10, opener)
    sink.push("0123456789abcdef\n")
    sink.close()
    assert sink.finish().artifact_id == "art1"


def test_max_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError):
        OutputSink(0)


# --- memory ---


@pytest.mark.parametrize("unit", ["x", "é"])
def test_one_huge_chunk_is_processed_without_full_size_copies(tmp_path: Path, unit: str) -> None:
    """A single 20 MB print (one iopub message): worked through in blocks, never copied whole."""
    text = unit * 10_000_000 + "\n"
    path = tmp_path / "artifact.txt"
    sink = OutputSink(50 * 1024, lambda: ("big", path.open("wb")))
    tracemalloc.start()
    try:
        shown = sink.push(text)
        summary = sink.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert shown is text  # streamed as it came: nothing to sanitize, no copy
    assert peak < 6 * 1024 * 1024, f"peak {peak} bytes"
    assert summary.total_bytes == path.stat().st_size == len(text.encode())
    assert summary.total_lines == 1


def test_spill_saves_text_as_an_artifact_of_its_own(tmp_path: Path) -> None:
    artifacts = Artifacts()
    sink = OutputSink(10, artifacts)
    assert sink.spill("<html>日本</html>" * 1000) == "art1"
    assert artifacts.text("art1") == "<html>日本</html>" * 1000 and artifacts.files["art1"].was_closed
    assert sink.finish().artifact_id is None  # the sink's own output is not affected
    assert OutputSink(10).spill("x") is None


@pytest.mark.parametrize("at", [0, 1 << 20, 3 * (1 << 20) + 5])
def test_a_long_ascii_chunk_with_controls_is_cleaned_like_a_short_one(tmp_path: Path, at: int) -> None:
    """The long-ASCII path (each block encoded once for the check and the count) keeps what the general
    path keeps: controls anywhere, in any block, are dropped from the text, the tail and the artifact."""
    text = "".join(f"{i:07d} " + "y" * 40 + "\n" for i in range(80_000))
    dirty = text[:at] + "\x07\x00" + text[at:] + "\x7f"
    path = tmp_path / "artifact.txt"
    sink = OutputSink(50 * 1024, lambda: ("a", path.open("wb")))
    shown = sink.push(dirty)
    summary = sink.finish()
    assert shown == text == sanitize(dirty)
    assert path.read_bytes() == text.encode()
    assert summary.total_bytes == len(text) and summary.total_lines == 80_000
    assert summary.output.endswith(text[-1000:])
