"""Decode a request body as JSON, refusing what cannot be meant, and encode a large answer without holding
the GIL for all of it (no I/O; large ones in the JSON thread, off the event loop)."""

from __future__ import annotations

import asyncio
import functools
import json
import json.scanner
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .errors import AgentToolsError, BadRequest

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def decode_json_body(body: bytes, max_bytes: int = 0, *, stepwise: bool = False) -> Any:
    """The body parsed as JSON, or a 4xx :class:`AgentToolsError` that says what is wrong with it.

    Checked before parsing: the size (413 past ``max_bytes``; 0: no limit), UTF-8. Refused while parsing:
    invalid JSON, nesting deeper than the parser's recursion limit, ``NaN``/``Infinity`` (not JSON), an
    object with the same key twice (which value was meant is ambiguous), and a string holding a lone
    UTF-16 surrogate escape (valid JSON, but not text that can be saved or sent on).

    ``stepwise``: parse with :class:`StepwiseDecoder`, for a thread that must not hold the GIL for long.
    """
    if max_bytes and len(body) > max_bytes:
        raise AgentToolsError(
            f"Request body is too large: {len(body)} bytes (at most {max_bytes}; the server's "
            "c.AgentToolsApp.max_body_bytes)",
            413,
        )
    if not body:
        raise BadRequest("Request body is empty: send a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("Request body is not UTF-8 encoded JSON") from None
    try:
        if stepwise:
            value = StepwiseDecoder().decode(text)
        else:
            value = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
        if _SURROGATE_ESCAPE.search(text):
            # "\ud800" alone is valid JSON but not Unicode: it could be neither saved nor sent on.
            json.dumps(value, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise BadRequest("Request body is nested too deeply") from None
    except UnicodeEncodeError:
        raise BadRequest(
            "Request body is not valid JSON: a \\u escape is a lone UTF-16 surrogate (not Unicode)"
        ) from None
    except ValueError as e:
        raise BadRequest(f"Request body is not valid JSON: {e}") from None
    return value


class StepwiseDecoder(json.JSONDecoder):
    """The same JSON, through Python's pure-Python scanner (strings and numbers are still read in C).

    It returns to the interpreter between values, so a thread that runs it gives the GIL up to the event
    loop every few milliseconds. The C scanner keeps the GIL for a whole array or object: 0.3-0.8 s for
    a 10 MB one of 700,000 keys. Slower (seconds for 10 MB of tiny values), as fast for long strings.
    """

    def __init__(self) -> None:
        super().__init__(parse_constant=_refuse_constant, object_pairs_hook=_unique_keys_stepwise)
        self.scan_once = json.scanner.py_make_scanner(self)  # type: ignore[attr-defined]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {_short(key)} in an object")
            seen.add(key)
    return obj


def _unique_keys_stepwise(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:  # not dict(pairs): one C call that holds the GIL for a million keys
        if key in obj:
            raise ValueError(f"duplicate key {_short(key)} in an object")
        obj[key] = value
    return obj


def _short(key: str) -> str:
    return repr(key) if len(key) <= 80 else repr(key[:77] + "...")


def larger_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (JSON-able) holds more than ``limit`` characters of strings and keys, roughly.

    Stops as soon as it knows, so its cost is bounded by ``limit`` however large ``value`` is."""
    size, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item) + 2
        elif isinstance(item, dict):
            size += 2 + sum(len(key) + 4 for key in item if isinstance(key, str))
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            size += 2 + len(item)
            stack.extend(item)
        else:
            size += 8
        if size > limit:
            return True
    return False


def encode_stepwise(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)``, through the pure-Python encoder (each string still in C).

    For a thread: it returns to the interpreter between values, so the event loop gets the GIL every few
    milliseconds, where the C encoder keeps it for the whole answer."""
    encoder = json.JSONEncoder(ensure_ascii=False)
    return "".join(encoder.iterencode(value, _one_shot=False))


# Parsing JSON costs about 1 ms per 10-30 KB (more with many small values): bodies larger than this are
# parsed in a thread, so that a 10 MB one does not hold the event loop for seconds. One thread: parsing
# holds the GIL, so more threads would not parse faster, only take more turns from the event loop.
PARSE_IN_THREAD_BYTES = 64 * 1024
JSON_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-tools-json")
# An answer holding more than this many characters is encoded in that thread too (a notebook read, a run's
# detail, a listing): encoding 10 MB in C holds the GIL, and so the event loop, for tens of milliseconds.
ENCODE_IN_THREAD_CHARS = 256 * 1024


async def decode_off_loop(body: bytes, max_bytes: int = 0) -> Any:
    """:func:`decode_json_body`, in the JSON thread when ``body`` is large (the loop keeps serving)."""
    if len(body) <= PARSE_IN_THREAD_BYTES or (max_bytes and len(body) > max_bytes):
        return decode_json_body(body, max_bytes)
    parse = functools.partial(decode_json_body, body, max_bytes, stepwise=True)
    return await asyncio.get_running_loop().run_in_executor(JSON_THREAD, parse)


async def encode_answer(data: Any) -> str:
    """``data`` as JSON text: on the event loop when it is small, else stepwise in the JSON thread."""
    if not larger_than(data, ENCODE_IN_THREAD_CHARS):
        return json.dumps(data, ensure_ascii=False)
    return await asyncio.get_running_loop().run_in_executor(JSON_THREAD, encode_stepwise, data)
