"""``ast.parse`` for the tests that read the package's source."""

from __future__ import annotations

import ast
import gc


def parse(source: str) -> ast.Module:
    """``ast.parse`` with the garbage collector held off meanwhile: a finalizer that runs in the middle of a
    parse (a coroutine an earlier test of the same worker left to the collector) trips CPython 3.11's check
    of the parser's recursion depth ("SystemError: AST constructor recursion depth mismatch")."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()
