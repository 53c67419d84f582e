"""Sanitizer rules: ANSI escapes, carriage returns, control characters."""

from __future__ import annotations

import json
import random

import pytest

from jupyter_agent_tools.text import (
    json_string_body,
    ndjson_line,
    resolve_carriage_returns,
    sanitize,
    split_incomplete_escape,
    strip_ansi,
    strip_controls,
)

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("\x1b[31mred\x1b[0m plain", "red plain"),
        ("\x1b[1;38;5;196mbold\x1b[22m\x1b[39m", "bold"),
        ("\x1b[38;2;255;0;0mtrue color\x1b[m", "true color"),
        ("a\x1b[2Kb\x1b[1A\x1b[10;20Hc\x1b[?25l\x1b[?25h", "abc"),  # erase line, cursor moves, cursor hide
        ("\x1b]0;window title\x07text", "text"),  # OSC ended by BEL
        ("\x1b]2;title\x1b\\text", "text"),  # OSC ended by ST
        ("\x1b]0;title\x9ctext", "text"),  # OSC ended by 8-bit ST
        ("see \x1b]8;;https://example.com\x1b\\the docs\x1b]8;;\x1b\\ now", "see the docs now"),  # OSC 8
        ("\x1bPq#0;2;0;0;0#0~~@@\x1b\\after", "after"),  # DCS (sixel)
        ("\x1bXsos\x1b\\\x1b^pm\x1b\\\x1b_apc\x1b\\x", "x"),  # SOS, PM, APC
        ("\x1b7saved\x1b8", "saved"),  # ESC 7 / ESC 8
        ("\x1bcreset", "reset"),  # ESC c
        ("\x1b(Bascii\x1b)0", "ascii"),  # charset designation with an intermediate byte
        ("\x1b=\x1b>keypad", "keypad"),
        ("\x9b31m8-bit\x9b0m", "8-bit"),  # 8-bit CSI
        ("\x9d0;t\x07osc8", "osc8"),  # 8-bit OSC
        ("\x90dcs\x9cdone", "done"),  # 8-bit DCS and ST
        ("the end\x1b", "the end"),  # lone ESC at the end
        ("cut \x1b[3", "cut "),  # CSI cut by the end of the text
        ("cut \x1b]0;unterminated", "cut "),  # OSC cut by the end of the text
        ("no escapes here", "no escapes here"),
    ],
)
def test_strip_ansi(raw: str, clean: str) -> None:
    assert strip_ansi(raw) == clean


def test_unterminated_osc_stops_at_newline() -> None:
    assert strip_ansi("a\x1b]0;broken title\nnext line\n") == "a\nnext line\n"


def test_lone_esc_before_newline_goes() -> None:
    assert sanitize("x\x1b\ny") == "x\ny"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("10%\r20%\r30%\n", "30%\n"),
        ("a\r\nb\r\n", "a\nb\n"),  # CRLF is a newline
        ("done\r", "done"),  # a line ending in \r keeps what was written
        ("abc\r\r\n", "abc\n"),
        ("\r  0%|\r 50%|\r100%|\nnext\n", "100%|\nnext\n"),  # tqdm writes \r first
        ("one\ntwo\rTWO\nthree", "one\nTWO\nthree"),
        ("plain\n", "plain\n"),
    ],
)
def test_resolve_carriage_returns(raw: str, clean: str) -> None:
    assert resolve_carriage_returns(raw) == clean


def test_controls_removed_tabs_and_newlines_kept() -> None:
    assert strip_controls("a\x00b\x07c\x08d\x0be\x0cf\x7fg\x85h\ti\nj\rk") == "abcdefgh\ti\nj\rk"


def test_lone_surrogate_removed() -> None:
    assert strip_controls("ok\ud800!") == "ok!"
    sanitize("ok\udfff").encode("utf-8")  # does not raise


def test_sanitize_all_rules_together() -> None:
    raw = "\x1b[32m 10%\x1b[0m\r\x1b[32m100%\x1b[0m\x07\n\tindented\x00\n"
    assert sanitize(raw) == "100%\n\tindented\n"


def test_sanitize_invisible_control_does_not_blank_a_progress_line() -> None:
    assert sanitize("100%\r\x07\n") == "100%\n"


def test_sanitize_keeps_unicode() -> None:
    assert sanitize("café 日本 🎉\n") == "café 日本 🎉\n"


@pytest.mark.parametrize(
    ("raw", "head", "tail"),
    [
        ("abc\x1b", "abc", "\x1b"),
        ("abc\x1b[3", "abc", "\x1b[3"),
        ("abc\x1b[38;5;", "abc", "\x1b[38;5;"),
        ("abc\x1b]0;tit", "abc", "\x1b]0;tit"),
        ("abc\x1b]0;title\x1b", "abc", "\x1b]0;title\x1b"),  # ESC could start ST
        ("abc\x1bPq#0", "abc", "\x1bPq#0"),
        ("abc\x1b(", "abc", "\x1b("),
        ("abc\x9b1", "abc", "\x9b1"),
        ("abc\x1b[31m", "abc\x1b[31m", ""),
        ("abc\x1b]0;t\x07", "abc\x1b]0;t\x07", ""),
        ("\x1b]0;t\nabc", "\x1b]0;t\nabc", ""),  # bodies never span a newline
        ("abc", "abc", ""),
        ("", "", ""),
        ("x\x1b[31mred\x1b[3", "x\x1b[31mred", "\x1b[3"),  # a finished sequence before the unfinished one
        ("a\x1b]0;x\x9by", "a", "\x1b]0;x\x9by"),  # an escape start inside a title's body
        ("y" * 200_000 + "\x1b[3", "y" * 200_000, "\x1b[3"),  # a long line without a newline
        ("\x1b]8;;" + "u" * 70_000, "\x1b]8;;" + "u" * 70_000, ""),  # longer than is held back: comes out cut
    ],
)
def test_split_incomplete_escape(raw: str, head: str, tail: str) -> None:
    assert split_incomplete_escape(raw) == (head, tail)


_ALPHABET = 'a "\\/\n\té€😀\u2028\x7f\r\x00\x1b\x85'  # what JSON escapes, and what it need not


@pytest.mark.parametrize("seed", range(20))
def test_json_string_body_is_json_dumps_or_declines(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(0, 40)))
        body = json_string_body(text)
        if body is None:  # only text with controls other than tab and newline is left to json
            assert any(c in text for c in "\r\x00\x1b"), text
        else:
            assert b'"' + body + b'"' == json.dumps(text, ensure_ascii=False).encode("utf-8")


def test_json_string_body_declines_lone_surrogates() -> None:
    assert json_string_body("a\ud800b") is None


@pytest.mark.parametrize(
    "event",
    [
        {"type": "chunk", "index": 0, "name": "stdout", "text": 'line "1"\t\\ é 😀\n' * 3},
        {"type": "chunk", "index": 2, "name": "stderr", "text": "bell\x07 and \r"},  # json escapes these
        {"type": "chunk", "index": 0, "name": "stdout", "text": ""},
        {"type": "chunk", "text": "x", "index": 1},  # text not last: json as a whole
        {"type": "cell_end", "index": 0, "status": "ok", "text": None},
        {"type": "error", "status": 400, "message": "größe"},
    ],
)
def test_ndjson_line_is_one_json_document_per_line(event: dict) -> None:
    line = ndjson_line(event)
    assert line == (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")
    assert line.count(b"\n") == 1 and json.loads(line) == event
