"""What each gated action shows the person, and how an approval binds the action to what was shown.

Shared by the HTTP routes and the MCP tools (no Tornado): an eval shows its code; a notebook run the cells
it would run (source and source hash, after its ops) and the notebook's hash; an edit its diff on the
notebook now. Once approved, a run checks the cells are still as shown (409 naming those that changed) and
runs under the hash the person saw; an edit is applied under that hash (409 if the notebook changed).
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
    """A notebook run: the cells it would run, with their source and its hash."""
    preview = await runner.preview(path, body)
    edit = f" after {_count(len(preview['ops']), 'edit')}" if preview["ops"] else ""
    return f"run {_count(len(preview['cells']))} in {preview['path']}{edit}", preview


async def bind_run(runner: NotebookRunner, approval: Approval, path: str, body: Any) -> Any:
    """The run's body once approved: only if each cell it runs is as the person saw it (409 naming those
    that changed), and under the notebook's hash now, so nothing changes between this check and the run.
    Notebook metadata written meanwhile (JupyterLab writes the kernel's language_info when a notebook opens)
    does not void an approval; a change of the cells does."""
    _found, notebook, hash_, _live = await runner.store.load(path, writable=True)
    still_as_approved(approval, notebook["cells"])
    return {**body, "expected_hash": hash_}


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
    seen = approval.details.get("cells_hash")
    if seen is None:  # a notebook to create: nothing was there to see
        return body
    _found, notebook, hash_, _live = await store.load(path, writable=True)
    if cells_hash(notebook) != seen:
        by_id = {c.get("id"): c for c in notebook["cells"] if isinstance(c.get("id"), str)}
        changed = [
            str(c.get("id") or "?")
            for c in approval.details.get("cells") or []
            if c.get("id") not in by_id
            or join_source(by_id[c["id"]].get("source", "")) != ((c.get("before") or {}).get("source") or "")
        ]
        raise Conflict(
            f"The notebook's cells changed since approval {approval.id} was given"
            + (f" (cell(s) {', '.join(changed)})" if changed else " (cells added, removed or moved)")
            + ". Nothing was written; ask again.",
            extra={"approval_id": approval.id, "cells": changed},
        )
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
