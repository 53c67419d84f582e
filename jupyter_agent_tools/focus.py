"""What the person is looking at in JupyterLab, shared with their agents when they choose (issue 48).

A browser tab whose person turned "Share my focus" on publishes what it shows (the notebook's path, the
active cell with its source and outputs, the text selected in it, the kernel's state) and for whom: every
agent, or agents named by their token names. The store keeps the latest of each tab, per person:

- in memory only, never on disk; bounded (``max_tabs``, every text cut, outputs summarized as a notebook read
  summarizes them);
- gone when the tab stops sharing (the toggle, the page closing), when it has not published for ``ttl``
  seconds (its heartbeat lapsed: a closed laptop, a crashed page), and with the server.

An agent reads the focus of the most recently active tab that shares with it and whose notebook is inside
the agent's paths (:func:`~.auth.context.path_allowed`, the one decision every path of a request goes
through). No such tab, or any tab outside its paths, answers the same "not shared": an agent cannot tell
a focus it may not see from none. "This cell" of the MCP notebook tools (``focus: true``) is
:meth:`FocusStore.focused_cell`: the same read, then the path goes on as if the agent gave it. Agents
point the person at something with an allow-listed UI action, delivered (an event on the server's event
bus, which agents never receive) to the tab the agent may see, else to every page as a notification. No
Tornado here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from traitlets import Float, Instance, Int, TraitError, Unicode, default, validate

from .audit import NO_AUDIT, Audit
from .audit.context import AGENT_PREFIX, current_user
from .audit.events import FOCUS
from .auth.context import path_allowed
from .auth.paths import normalize
from .errors import AgentToolsError, BadRequest
from .notebook.summary import summarize_output, truncate_text
from .service import Service, in_range, trait_name

FOCUS_URI = "jupyter://focus"
TAB_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")
ALL_AGENTS = "all"
# The UI actions an agent may ask for, and what each needs: nothing else is ever sent to a page.
UI_ACTIONS = {
    "open_notebook": ("path",),
    "reveal_cell": ("path",),  # and cell_id or cell_index
    "show_change": ("path", "change_id"),
    "open_approval": ("approval_id",),
}
READ_EVENT_SECONDS = 2.0  # "read by agent:X" is told at most this often per agent and tab
NOT_SHARED = (
    "The person is not sharing their focus with agent {agent}, or it is a notebook outside this agent's "
    "paths. The person shares it in JupyterLab: the Agents panel's 'Share my focus' toggle, or the command "
    "'Share My Focus with Agents' in the command palette (off by default; they choose all agents or named "
    "ones)."
)
NO_CELL = (
    "The shared focus has no active cell{where}: the person selects one in JupyterLab, or name the notebook "
    "and cell yourself (without focus)."
)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Shared:
    """One tab's shared focus (as bounded when published)."""

    tab: str
    person: str
    agents: frozenset[str] | None  # None: every agent
    path: str | None
    cell: dict[str, Any] | None
    selection: dict[str, Any] | None
    kernel: dict[str, Any] | None
    updated: str
    seen: float = 0.0  # time.monotonic() when last published
    version: int = 0

    def shares_with(self, agent: str | None) -> bool:
        """Whether ``agent`` (a token name; None: not an agent) may see this tab's focus."""
        return agent is None or self.agents is None or agent in self.agents

    def to_json(self) -> dict[str, Any]:
        return {
            "tab": self.tab,
            "path": self.path,
            "cell": self.cell,
            "selection": self.selection,
            "kernel": self.kernel,
            "updated": self.updated,
            "shared_with": ALL_AGENTS if self.agents is None else sorted(self.agents),
        }


@dataclass(frozen=True)
class FocusedCell:
    """The notebook and active cell of a shared focus ("this cell")."""

    path: str
    id: str | None
    index: int | None

    @property
    def ref(self) -> str:
        """The cell as a notebook read names it: its id, or ``@index`` for a cell without one."""
        return self.id if self.id is not None else f"@{self.index}"


class FocusStore(Service):
    """The shared focus of the person's browser tabs (see the module doc)."""

    ttl = Float(
        60.0,
        help="Seconds a tab's shared focus is kept without the tab publishing it again; the Agents panel "
        "publishes every 20 s while sharing (its heartbeat), so a closed or frozen page's focus goes "
        "within this time. Between 5 and 3600.",
    ).tag(config=True)
    max_tabs = Int(
        32,
        help="Most browser tabs sharing their focus at once (all people together); a new tab past it "
        "replaces the one that published least recently.",
    ).tag(config=True)
    max_source_chars = Int(
        20_000, help="Characters of the focused cell's source kept; longer source is cut with a note."
    ).tag(config=True)
    max_selection_chars = Int(
        4000, help="Characters of the selected text kept; a longer selection is cut with a note."
    ).tag(config=True)
    max_output_chars = Int(
        2000,
        help="Characters of each text output of the focused cell kept (as NotebookStore.summary_max_chars "
        "cuts a notebook read); images and other data are named with their size only.",
    ).tag(config=True)
    max_outputs = Int(
        20, help="Outputs of the focused cell kept (the first ones); the rest are counted."
    ).tag(config=True)
    max_publish_bytes = Int(
        2 * 1024 * 1024,
        help="Largest body a tab may publish (bytes); a larger one answers 413 (the panel then sends the "
        "cell without its outputs' data).",
    ).tag(config=True)
    owner = Unicode(
        None,
        allow_none=True,
        help="The person whose focus this server's agents may read (their username); others' tabs may not "
        "share. Default: on a JupyterHub single-user server the hub user whose server it is "
        "($JUPYTERHUB_USER), else None: whoever is logged in to the server (it is one person's).",
    ).tag(config=True)
    audit = Instance(Audit, help="Tells the Agents panel (the event bus) what agents read and ask to show.")
    root_dir = Unicode(
        None, allow_none=True, help="The local root (symlinks followed when paths are checked)."
    )

    @default("audit")
    def _default_audit(self) -> Audit:
        return NO_AUDIT

    @default("owner")
    def _default_owner(self) -> str | None:
        return os.environ.get("JUPYTERHUB_USER") or None

    @validate("ttl")
    def _valid_ttl(self, proposal: Any) -> Any:
        value = proposal["value"]
        if not 5 <= value <= 3600:
            raise TraitError(f"{trait_name(proposal)} must be between 5 and 3600 seconds, got {value}")
        return value

    @validate("max_tabs")
    def _valid_tabs(self, proposal: Any) -> int:
        return in_range(proposal, 1, 10_000, "tabs")

    @validate("max_source_chars", "max_selection_chars", "max_output_chars")
    def _valid_chars(self, proposal: Any) -> int:
        return in_range(proposal, 100, 10_000_000, "characters")

    @validate("max_outputs")
    def _valid_outputs(self, proposal: Any) -> int:
        return in_range(proposal, 0, 1000, "outputs")

    @validate("max_publish_bytes")
    def _valid_publish(self, proposal: Any) -> int:
        return in_range(proposal, 64 * 1024, 1024**3)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._tabs: OrderedDict[tuple[str, str], Shared] = OrderedDict()  # least recently published first
        self._version = 0
        self._listeners: list[Callable[[], None]] = []
        self._read_told: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._sweeper: asyncio.Task[None] | None = None

    # -- the person's tab ----------------------------------------------------------------------------

    def may_share(self, person: str) -> str | None:
        """Why ``person`` may not share a focus here (a message), or None when they may."""
        if self.owner is None or person == self.owner:
            return None
        return f"Only {self.owner}, whose server this is, shares their focus with its agents."

    def publish(self, person: str, tab: str, body: dict[str, Any]) -> Shared:
        """Keep what ``tab`` of ``person`` shows (a body valid against the FocusPublish schema), bounded."""
        refused = self.may_share(person)
        if refused:
            raise AgentToolsError(refused, 403)
        check_tab(tab)
        path = body.get("path")
        if path is not None and normalize(path) in (None, ""):
            raise BadRequest(f"'path' must be a path under the server root, got {path[:200]!r}")
        agents = body.get("agents", ALL_AGENTS)
        self._sweep()
        key = (person, tab)
        self._version += 1
        shared = Shared(
            tab=tab,
            person=person,
            agents=None if agents == ALL_AGENTS else frozenset(agents),
            path=normalize(path) if path is not None else None,
            cell=self._cell(body.get("cell")),
            selection=self._selection(body.get("selection")),
            kernel=self._kernel(body.get("kernel")),
            updated=now_iso(),
            seen=time.monotonic(),
            version=self._version,
        )
        before = self._tabs.pop(key, None)
        if before is not None and _same(before, shared):
            shared.version, shared.updated = before.version, before.updated  # a heartbeat: nothing changed
            self._version -= 1
        self._tabs[key] = shared
        while len(self._tabs) > self.max_tabs:
            self._tabs.popitem(last=False)
        if before is None or shared.version != before.version:
            self._changed()
        return shared

    def stop(self, person: str, tab: str) -> bool:
        """``tab`` of ``person`` stops sharing: its focus goes at once. False when it was not sharing."""
        check_tab(tab)
        gone = self._tabs.pop((person, tab), None) is not None
        if gone:
            self._changed()
        return gone

    # -- agents --------------------------------------------------------------------------------------

    def visible(self, agent: str | None, *, sweep: bool = True) -> Shared | None:
        """The focus the request being served may see: ``agent`` is the caller's token name (None: not an
        agent); the most recently active tab of the server's person that shares with it and whose
        notebook its paths reach (checked for the request being served, :func:`path_allowed`). Lapsed tabs
        are swept first unless ``sweep`` is False (a listener asking while it is told of a change)."""
        if sweep:
            self._sweep()
        for shared in reversed(self._tabs.values()):
            if self.owner is not None and shared.person != self.owner:
                continue
            if not shared.shares_with(agent):
                continue
            if shared.path is not None and not path_allowed(shared.path, self.root_dir):
                continue
            return shared
        return None

    def read(self, agent: str | None) -> dict[str, Any]:
        """The focus an agent (its token name; None: not an agent) reads, or a 403 saying how the person
        shares it. The Agents panel is told who read it (at most every few seconds per agent and tab)."""
        shared = self.visible(agent)
        if shared is None:
            raise AgentToolsError(NOT_SHARED.format(agent=repr(agent) if agent else "(you)"), 403)
        if agent is not None:
            self._tell_read(agent, shared)
        return shared.to_json()

    def focused_cell(self, agent: str | None, path: str | None = None) -> FocusedCell:
        """The cell a tool's ``focus: true`` names for ``agent`` ("this cell"): the notebook and active
        cell of the focus it reads (a read, told to the panel as :meth:`read` tells it). 403 as
        :meth:`read` when none is shared with it; 409 when the focus has no notebook or no active cell;
        400 when ``path`` is given and names another notebook. The path is then authorized as any path
        the agent gives (its paths, scopes, the approval gate)."""
        focus = self.read(agent)
        where, cell = focus["path"], focus["cell"] or {}
        if not where or not where.endswith(".ipynb"):
            raise AgentToolsError(NO_CELL.format(where=" (it is not on a notebook)"), 409)
        if path is not None and normalize(path) != where:
            raise BadRequest(
                f"focus: true is the notebook the person shares, {where!r}, not 'path' "
                f"{str(path)[:200]!r}: leave 'path' out, or give that one"
            )
        if cell.get("id") is None and cell.get("index") is None:
            raise AgentToolsError(NO_CELL.format(where=f" in {where}"), 409)
        return FocusedCell(where, cell.get("id"), cell.get("index"))

    def signature(self, agent: str | None) -> tuple[str, int] | None:
        """What ``agent`` would read, as (tab, version): it changed when this changes."""
        shared = self.visible(agent, sweep=False)
        return None if shared is None else (shared.tab, shared.version)

    def act(self, agent: str | None, action: dict[str, Any]) -> dict[str, Any]:
        """Deliver a UI action (valid against the FocusAction schema) of ``agent``: to the tab it may see,
        else as a notification on every page of the server. The path it names must be inside the agent's
        paths (404 otherwise, as for a notebook read)."""
        name = action["action"]
        for needed in UI_ACTIONS[name]:
            if action.get(needed) is None:
                raise BadRequest(f"The UI action {name!r} needs {needed!r}")
        if name == "reveal_cell" and action.get("cell_id") is None and action.get("cell_index") is None:
            raise BadRequest("The UI action 'reveal_cell' needs 'cell_id' or 'cell_index'")
        path = action.get("path")
        if path is not None:
            normal = normalize(path)
            if not normal or not normal.endswith(".ipynb") or not path_allowed(normal, self.root_dir):
                raise AgentToolsError(f"Notebook not found: {str(path)[:200]}", 404)
            path = normal
        shared = self.visible(agent)
        data: dict[str, Any] = {
            "event": "action",
            "user": AGENT_PREFIX + agent if agent else (current_user() or "unknown"),
            "tab": shared.tab if shared is not None else None,
            "action": name,
        }
        for key in ("cell_id", "cell_index", "change_id", "approval_id", "message"):
            if action.get(key) is not None:
                data[key] = action[key]
        if path is not None:
            data["path"] = path
        delivered = self.audit.listening(FOCUS)
        self.audit.emit(FOCUS, data)
        where = "tab" if shared is not None else "notification"
        if not delivered:
            where = "none"
        return {
            "delivered": where,
            "action": name,
            "message": {
                "tab": "Shown in the browser tab that shares its focus with you.",
                "notification": "No tab shares its focus with you: JupyterLab shows it as a notification the "
                "person can click.",
                "none": "No JupyterLab page is open on this server: nothing was shown.",
            }[where],
        }

    # -- change listeners (MCP subscriptions) ----------------------------------------------------------

    def on_change(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` after every change of any tab's focus; returns what removes it."""
        self._listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    def start(self) -> None:
        """Sweep lapsed tabs in the background (their listeners are told at once)."""
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep_forever())

    def stop_sweeping(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.ttl / 4))
            self._sweep()

    def _sweep(self) -> None:
        cutoff = time.monotonic() - self.ttl
        lapsed = [key for key, shared in self._tabs.items() if shared.seen < cutoff]
        for key in lapsed:
            del self._tabs[key]
        if lapsed:
            self._changed()

    def _changed(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # broad: one listener (an MCP subscription) failing must not silence the others
                self.log.exception("a focus listener failed")

    def _tell_read(self, agent: str, shared: Shared) -> None:
        key = (agent, shared.tab)
        now = time.monotonic()
        last = self._read_told.pop(key, None)
        self._read_told[key] = now if last is None or now - last >= READ_EVENT_SECONDS else last
        while len(self._read_told) > 4 * self.max_tabs:
            self._read_told.popitem(last=False)
        if last is not None and now - last < READ_EVENT_SECONDS:
            return
        data = {"event": "read", "user": AGENT_PREFIX + agent, "tab": shared.tab}
        if shared.path is not None:
            data["path"] = shared.path
        self.audit.emit(FOCUS, data)

    # -- bounds --------------------------------------------------------------------------------------

    def _cell(self, cell: Any) -> dict[str, Any] | None:
        if not isinstance(cell, dict):
            return None
        outputs = [o for o in cell.get("outputs") or [] if isinstance(o, dict)]
        kept = outputs[: self.max_outputs]
        bounded: dict[str, Any] = {
            "id": cell.get("id"),
            "index": cell.get("index"),
            "cell_type": cell.get("cell_type", "code"),
            "source": truncate_text(cell.get("source") or "", self.max_source_chars),
            "execution_count": cell.get("execution_count"),
        }
        if bounded["cell_type"] == "code":
            bounded["outputs"] = [summarize_output(o, self.max_output_chars, False) for o in kept]
            if len(outputs) > len(kept):
                bounded["outputs_omitted"] = len(outputs) - len(kept)
        return bounded

    def _selection(self, selection: Any) -> dict[str, Any] | None:
        if not isinstance(selection, dict) or not selection.get("text"):
            return None
        bounded: dict[str, Any] = {"text": truncate_text(selection["text"], self.max_selection_chars)}
        for end in ("start", "end"):
            if isinstance(selection.get(end), dict):
                bounded[end] = {k: selection[end][k] for k in ("line", "column") if k in selection[end]}
        return bounded

    @staticmethod
    def _kernel(kernel: Any) -> dict[str, Any] | None:
        if not isinstance(kernel, dict):
            return None
        return {k: kernel.get(k) for k in ("name", "status", "execution_count") if kernel.get(k) is not None}


def check_tab(tab: str) -> str:
    if not TAB_ID.fullmatch(tab):
        raise BadRequest(f"A tab id is 8 to 64 letters, digits, '_' or '-', got {tab[:80]!r}")
    return tab


def _same(a: Shared, b: Shared) -> bool:
    return (a.agents, a.path, a.cell, a.selection, a.kernel) == (
        b.agents,
        b.path,
        b.cell,
        b.selection,
        b.kernel,
    )
