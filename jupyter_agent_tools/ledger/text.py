"""Recorded changes as text, for a model's context (the MCP tools) and a terminal (the CLI). Pure."""

from __future__ import annotations

from typing import Any

SHOWN_CELLS = 20


def change_line(entry: dict[str, Any]) -> str:
    """One line per change: id, time, who and how, the summary, the cells it touched."""
    cells = entry.get("cells") or []
    named = ", ".join(f"{c.get('id') or '?'} {'+'.join(c.get('what') or [])}" for c in cells[:SHOWN_CELLS])
    more = f" (+{len(cells) - SHOWN_CELLS} more)" if len(cells) > SHOWN_CELLS else ""
    undo = "" if entry.get("undoable", True) else " [cannot be undone]"
    return (
        f"change {entry['id']} {entry['time']} by {entry.get('user') or 'unknown'} via "
        f"{entry.get('via') or '-'}: {entry['action']}{undo}; cells: {named or 'none'}{more}"
    )


def change_text(entry: dict[str, Any]) -> str:
    """One change in full: its line, then each cell with what happened and its source diff."""
    lines = [change_line(entry)]
    for cell in entry.get("cells") or []:
        lines.append(f"cell {cell.get('id') or '?'}: {', '.join(cell.get('what') or [])}")
        if cell.get("diff"):
            lines.append(str(cell["diff"]).rstrip("\n"))
    return "\n".join(lines)


def changes_text(listing: dict[str, Any], path: str | None = None) -> str:
    """A listing of changes, newest first, and how to get the older ones."""
    lines = [change_line(entry) for entry in listing.get("changes") or []]
    if not lines:
        lines = [f"No recorded changes of {path}." if path else "No recorded changes."]
    if listing.get("next_before"):
        lines.append(f"(older changes: before={listing['next_before']})")
    return "\n".join(lines)
