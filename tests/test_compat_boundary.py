"""compat.py is the one place that reads other packages' private state and patches their objects (issue 47.5).

Every module of the package but ``compat.py`` is parsed, and two things fail here:

- **A private upstream read**: ``x._name`` (or ``getattr``/``hasattr``/``setattr``/``delattr`` with a
  constant ``"_name"``) where ``_name`` is not defined anywhere in the package outside compat.py (no
  ``def``/``class``, no ``self._name =``, no assignment, argument or import of that name), or where
  ``_name`` is one compat.py itself reads from an upstream object and the access is not on ``self``/``cls``
  of a class of ours that defines it. Our own private names are told from upstream's by where they are
  defined: a name the package defines is ours.
- **A patch**: a ``setattr``/``delattr`` call, an assignment into an object's ``__dict__``, an assignment
  to an attribute of a class or module imported from an upstream package, or an assignment of a function
  defined here (or a lambda) to an attribute of anything but ``self``/``cls`` (an instance wrap such as
  ``contents_manager.save = save``: use ``compat.wrap_once``).

What compat.py holds is checked against the real packages in ``tests/test_compat.py``.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
from parsing import parse

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_agent_tools"
COMPAT = PACKAGE / "compat.py"
# The packages whose objects are "upstream" for the patch rule (their classes and modules).
UPSTREAM = (
    "jupyter_server",
    "jupyter_client",
    "jupyter_core",
    "jupyter_events",
    "jupyter_server_ydoc",
    "jupyter_ydoc",
    "jupyter_collaboration",
    "pycrdt",
    "tornado",
    "zmq",
    "traitlets",
    "nbformat",
    "prometheus_client",
)
READERS = ("getattr", "hasattr", "setattr", "delattr")
# Exceptions, each with its reason: (module relative to the package, the private name or the patch's
# source) -> why.
ALLOWED_READS: dict[tuple[str, str], str] = {
    (
        "auth/identity.py",
        "_signed_token_refused",
    ): "our flag on the request's handler (MCP's 401)",
    (
        "handlers/mcp.py",
        "_signed_token_refused",
    ): "our flag, read by the handler it was set on",
}
ALLOWED_PATCHES: dict[tuple[str, str], str] = {
    (
        "service.py",
        "setattr(service, name, old[name])",
    ): "a moved setting, set on our own service",
}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "labextension" not in p.parts)


@functools.cache
def parsed(path: Path) -> ast.Module:
    return parse(path.read_text(encoding="utf-8"))


def private_uses(tree: ast.AST) -> Iterator[tuple[int, str, ast.expr]]:
    """Each private attribute a module reads or writes: (line, name, the object it is read on)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            yield node.lineno, node.attr, node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in READERS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and is_private(node.args[1].value)
        ):
            yield node.lineno, node.args[1].value, node.args[0]


def defined_names(tree: ast.AST) -> set[str]:
    """Every name a module defines: functions, classes, arguments, assigned names and ``self``/``cls``
    attributes, imports."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            found.add(node.attr)
    return found


def upstream_private_names(compat: ast.AST) -> set[str]:
    """The private names compat.py reads on other packages' objects (attributes, ``getattr`` names and
    the names it keeps as strings, such as the kernel manager's tables), less those it defines."""
    names = {name for _, name, _ in private_uses(compat)}
    names.update(
        node.value
        for node in ast.walk(compat)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.isidentifier()
        and is_private(node.value)
    )
    assert isinstance(compat, ast.Module)
    helpers = {  # its own, at module level (a wrapper it installs keeps the upstream method's name)
        n.name for n in compat.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    helpers.update(
        t.id for n in compat.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
    )
    return names - helpers


def on_self(receiver: ast.expr) -> bool:
    return isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")


def private_reads(
    tree: ast.AST, ours: set[str], upstream: set[str], module: str = "<test>"
) -> list[tuple[int, str]]:
    """The private upstream reads of one module: (line, name)."""
    return [
        (line, name)
        for line, name, receiver in private_uses(tree)
        if (name not in ours or (name in upstream and not on_self(receiver)))
        and (module, name) not in ALLOWED_READS
    ]


def imported_upstream(tree: ast.AST) -> set[str]:
    """The names a module binds to upstream classes and modules."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(
                (a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in UPSTREAM
            )
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] in UPSTREAM
        ):
            found.update(a.asname or a.name for a in node.names)
    return found


def patches(tree: ast.AST, module: str = "<test>") -> list[tuple[int, str]]:
    """The patches of other packages' objects in one module: (line, what)."""
    upstream = imported_upstream(tree)
    variables = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    functions = {
        n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    } - variables  # a function's name, never a variable's
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
        ):
            found.append((node.lineno, ast.unparse(node)))
        if not isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = node.value
        for target in targets:
            dict_item = isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
            if dict_item and target.value.attr == "__dict__":  # type: ignore[attr-defined]
                found.append((node.lineno, ast.unparse(target)))
            if not isinstance(target, ast.Attribute):
                continue
            root = target.value
            while isinstance(root, ast.Attribute):
                root = root.value
            on_upstream = isinstance(root, ast.Name) and root.id in upstream
            wraps = not on_self(target.value) and (
                isinstance(value, ast.Lambda) or (isinstance(value, ast.Name) and value.id in functions)
            )
            if on_upstream or wraps:
                found.append((node.lineno, ast.unparse(target)))
    return [(line, what) for line, what in found if (module, what) not in ALLOWED_PATCHES]


def name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def test_private_upstream_state_is_read_only_in_compat() -> None:
    others = [p for p in modules() if p != COMPAT]
    ours: set[str] = set().union(*(defined_names(parsed(p)) for p in others))
    upstream = upstream_private_names(parsed(COMPAT))
    assert {"_pending_kernels", "_finish_model", "_add_digest"} <= upstream  # the rule sees compat's reads
    found = {name(p): private_reads(parsed(p), ours, upstream, name(p)) for p in others}
    assert {k: v for k, v in found.items() if v} == {}, "move these reads into compat.py"


def test_other_packages_are_patched_only_in_compat() -> None:
    found = {name(p): patches(parsed(p), name(p)) for p in modules() if p != COMPAT}
    assert {k: v for k, v in found.items() if v} == {}, "patch through compat.py (install, wrap_once)"
    assert patches(parsed(COMPAT)), "the rule finds compat's own patches"


def test_the_patches_are_applied_at_extension_load_not_by_the_identity_provider() -> None:
    """compat.install() is called from the extension's load, and nothing else applies a guard."""
    callers = {
        name(p)
        for p in modules()
        if p != COMPAT
        for node in ast.walk(parsed(p))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and (node.func.id.startswith("guard_") or node.func.id in ("install", "install_compat"))
    }
    assert callers == {"app.py"}
    load = next(
        n
        for n in ast.walk(parsed(PACKAGE / "app.py"))
        if isinstance(n, ast.FunctionDef) and n.name == "_load_jupyter_server_extension"
    )
    first = load.body[1]  # after the docstring
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)
    assert ast.unparse(first.value.func) == "install_compat"


CAUGHT = """
from tornado.web import RequestHandler
import jupyter_server.base.handlers as jh

class Mine:
    def __init__(self):
        self._mine = 1
        self._finished = False  # a name compat reads upstream, defined by us too

    def read(self, km, handler):
        km._pending_kernels.pop("k")          # compat's name on an upstream object
        getattr(handler, "_jupyter_current_user", None)
        handler._never_defined_here            # not a name of ours at all
        return self._mine, self._finished      # ours

def save(model):
    return model

def wire(cm):
    cm.save = save
    cm.get = lambda path: None
    RequestHandler.finish = save
    jh.JupyterHandler.x = 1
    setattr(cm, "rename", save)
    cm.__dict__["on_message"] = save
    cm.name = "fine"
"""


def test_the_rules_catch_what_they_name() -> None:
    """The checks above, on a module written to break them: each rule can fail."""
    tree = parse(CAUGHT)
    upstream = upstream_private_names(parsed(COMPAT)) | {"_finished"}
    reads = private_reads(tree, defined_names(tree), upstream)
    assert sorted(reads) == [
        (11, "_pending_kernels"),
        (12, "_jupyter_current_user"),
        (13, "_never_defined_here"),
    ]
    assert sorted(patches(tree)) == [
        (20, "cm.save"),
        (21, "cm.get"),
        (22, "RequestHandler.finish"),
        (23, "jh.JupyterHandler.x"),
        (24, "setattr(cm, 'rename', save)"),
        (25, "cm.__dict__['on_message']"),
    ]
