"""What each gated action shows the person, and how an approval binds the action to what was shown.

Shared by the HTTP routes and the MCP tools (no Tornado): an eval shows its code; a notebook run the cells
it would run (source and source hash, after its ops), the notebook's hash, and its ops' diff; an edit its
diff on the notebook now. Once approved, a run plans again on the notebook now and goes on only with the
plan the person saw (409 naming the cells that differ), pinned to those cells under the notebook's hash;
an edit is applied under the hash it was checked at (409 if the notebook's cells changed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import Conflict
from ..notebook.format import cells_hash, join_source
from .gate import Describe, described, still_as_approved
from .records import Approval

if TYPE_CHECKING:
    from ..execution.notebook_run import NotebookRunner
    from ..notebook.store import NotebookStore


def _count(n: int, what: str = "cell") -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


EVAL_SHOWN = ("notebook", "session", "mode", "reset", "kernel_name", "cwd", "env", "timeout")


async def describe_eval(body: Any) -> tuple[str, dict[str, Any]]:
    """An eval: each cell's code, and where and how it runs (session, mode, reset, kernel, cwd, env: each
    field the body sets)."""
    cells = [{"code": c.get("code"), "title": c.get("title")} for c in body.get("cells") or []]
    where = (
        f"in {body['notebook']}" if body.get("notebook") else f"in session {body.get('session', 'default')!r}"
    )
    how = {name: body[name] for name in EVAL_SHOWN if body.get(name) is not None}
    return f"run {_count(len(cells))} {where}", {"cells": cells, **how}


async def describe_run(runner: NotebookRunner, path: str, body: Any) -> tuple[str, dict[str, Any]]:
    """A notebook run: the cells it would run, with their source and its hash. The summary counts the
    code cells (markdown and raw cells it names are shown, but not run)."""
    preview = await runner.preview(path, body)
    edit = f" after {_count(len(preview['ops']), 'edit')}" if preview["ops"] else ""
    code = sum(1 for c in preview["cells"] if c.get("cell_type") == "code")
    return f"run {_count(code)} in {preview['path']}{edit}", preview


def run_also(body: Any) -> tuple[str, ...]:
    """A run's classes of action besides ``execute``: with ``ops`` it edits the notebook too."""
    return ("edit",) if isinstance(body, dict) and body.get("ops") else ()


async def bind_run(runner: NotebookRunner, approval: Approval, path: str, body: Any) -> Any:
    """The run's body once approved, pinned to what the person approved, or 409 naming what changed.

    The plan the person saw is compared with the plan the same body makes on the notebook now (the
    cells to run by id, type and source hash; a run with ``ops`` also needs the notebook's cells as
    they were, since its ops are applied to them). The body then names those cells by index under the
    notebook's hash now: the run checks that hash before it applies or runs anything, so its own plan
    cannot pick other cells. Notebook metadata written meanwhile (JupyterLab writes the kernel's
    language_info when a notebook opens) does not void an approval; a change of the cells does."""
    seen = approval.details
    now = await runner.preview(path, body)
    if seen.get("ops") and now.get("cells_hash") != seen.get("cells_hash"):
        _found, notebook, _hash, _live = await runner.store.load(path, writable=True)
        raise _cells_changed(approval, notebook, seen.get("edit") or {})
    still_as_approved(approval, now["cells"])
    pinned = {k: v for k, v in body.items() if k not in ("all", "cell_ids", "cell_indices")}
    if now["cells"]:
        pinned["cell_indices"] = [c["index"] for c in now["cells"]]
    elif not seen.get("ops"):  # nothing to run ("all" of a notebook without cells): as it was asked
        pinned = dict(body)
    return {**pinned, "expected_hash": now["hash"]}


def _cells_changed(approval: Approval, notebook: dict[str, Any], diff: dict[str, Any]) -> Conflict:
    """The 409 of an approved edit whose notebook's cells changed since, naming the cells the edit
    (``diff``) touches that changed (nothing is written or run)."""
    by_id = {c.get("id"): c for c in notebook["cells"] if isinstance(c.get("id"), str)}
    changed = [
        str(c.get("id") or "?")
        for c in diff.get("cells") or []
        if c.get("id") not in by_id
        or join_source(by_id[c["id"]].get("source", "")) != ((c.get("before") or {}).get("source") or "")
    ]
    return Conflict(
        f"The notebook's cells changed since approval {approval.id} was given"
        + (f" (cell(s) {', '.join(changed)})" if changed else " (cells added, removed or moved)")
        + ". Nothing was written; ask again.",
        extra={"approval_id": approval.id, "cells": changed},
    )


async def describe_edit(
    store: NotebookStore, path: str, body: Any, creating: bool
) -> tuple[str, dict[str, Any]]:
    """An edit: its diff on the notebook now (a new notebook: what it is made of)."""
    if creating:
        return f"create {path}", {"path": path, "body": body}
    preview = await store.preview_edit(path, body)
    return f"{preview['summary']} in {preview['path']}", preview


async def bind_edit(store: NotebookStore, approval: Approval, path: str, body: Any) -> Any:
    """The edit's body once approved: only if the notebook's cells are as the person saw them (409 naming
    the cells the edit touches that changed; notebook metadata written meanwhile does not count), and
    under the notebook's hash now, so nothing changes between this check and the write."""
    if approval.details.get("cells_hash") is None:  # a notebook to create: nothing was there to see
        return body
    _found, notebook, hash_, _live = await store.load(path, writable=True)
    if cells_hash(notebook) != approval.details["cells_hash"]:
        raise _cells_changed(approval, notebook, approval.details)
    return {**body, "expected_hash": hash_}


async def describe_undo(store: NotebookStore, path: str, change_id: str) -> tuple[str, dict[str, Any]]:
    change = await store.change_detail(path, change_id)
    return f"undo change {change_id} of {path}", {"path": path, "change": change}


def describe_kernel_action(path: str, body: Any) -> Describe:
    """A notebook kernel's interrupt, restart or shutdown."""
    action = body.get("action") if isinstance(body, dict) else None
    what = action if isinstance(action, str) else "change"
    return described(f"{what} the kernel of {path}", {"path": path, "body": body})


def describe_session_delete(name: Any) -> Describe:
    return described(f"shut down session {name!r}", {"session": name})
