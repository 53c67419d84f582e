"""``AgentAuthorizer``: the server's authorizer, plus the scopes and path globs of agent tokens.

jupyter_server asks its authorizer an (action, resource) pair on every route: contents, files, kernels and
their websockets, sessions, terminals, kernelspecs, events, nbconvert, and this extension's routes and
MCP tools. For a user that is not an agent, the wrapped authorizer (``authorizer_class``, by default
jupyter_server's own ``AllowAllAuthorizer``) answers exactly as it would alone. For an agent, the pair must
be granted by one of its scopes (:mod:`.scopes`), a route that names a file must name one inside its path
globs (else 404, as if the file did not exist), and then the wrapped authorizer must agree too.

A refusal answers 403 with a message naming the scope that is missing, and is recorded as a ``refusal``
audit event (with its reason) and in the ``jupyter_agent_agent_requests`` metric.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.authorizer import AllowAllAuthorizer, Authorizer
from tornado import web
from traitlets import Instance, Type

from ..audit import metrics
from ..wire import REFUSED_MISSING_SCOPE, REFUSED_NOT_FOR_AGENTS
from .identity import APPROVALS_SETTING, ROOM_WEBSOCKET, AgentUser
from .paths import normalize
from .scopes import PATH_RESOURCES, needed, refusal

# Handlers whose path is their one positional URL argument (jupyter_server's /files/).
FILE_HANDLERS = frozenset(
    {"jupyter_server.files.handlers.FilesHandler", "jupyter_server.base.handlers.AuthenticatedFileHandler"}
)
CONTENTS_HANDLER = "jupyter_server.services.contents.handlers.ContentsHandler"
AGENT_HANDLER = "jupyter_agent_tools.handlers.base.AgentAPIHandler"
IDENTITY_HANDLER = "jupyter_server.services.api.handlers.IdentityHandler"
# jupyter-collaboration's routes (jupyter_server_ydoc 3): the room websocket applies the Yjs updates it
# receives although it asks only "read", so for agents it needs "write" (the edit scope) on the file the
# room's id names; undo/redo names a room, the session and timeline routes a path; forks are not agents'.
COLLABORATION = "jupyter_server_ydoc.handlers."
ROOM_HANDLERS = frozenset({ROOM_WEBSOCKET, COLLABORATION + "UndoRedoHandler"})
COLLABORATION_PATH_HANDLERS = frozenset(
    {COLLABORATION + "DocSessionHandler", COLLABORATION + "TimelineHandler"}
)
FORK_HANDLER = COLLABORATION + "DocForkHandler"
# Where the settings of the web application hold the extension's audit facade and its approval gate.
AUDIT_SETTING = "jupyter_agent_tools_audit"
# The approval gate's classes of action (approvals/policy.py) that each (resource, action) of
# jupyter_server's own routes performs: a contents write is an edit (save, rename, copy, upload, chunked
# upload, checkpoints, a collaboration room and its undo/redo); a kernels or sessions write starts, restarts,
# interrupts or shuts down kernels, and the kernel websocket runs code and sends control messages (execute
# and kernel); a terminal runs code. Reads are limited by the token's paths less what ``deny read`` hides.
GATED: dict[tuple[str, str], tuple[str, ...]] = {
    ("contents", "write"): ("edit",),
    ("kernels", "write"): ("execute", "kernel"),
    ("kernels", "execute"): ("execute", "kernel"),
    ("sessions", "write"): ("execute", "kernel"),
    ("terminals", "read"): ("execute",),
    ("terminals", "write"): ("execute",),
    ("terminals", "execute"): ("execute",),
}
# What an agent whose action must be asked uses instead: the agent routes wait for the person.
INSTEAD = {
    "edit": "use /api/agent/notebooks/{path} (or MCP notebook_edit), which waits for the approval",
    "execute": "use the agent routes (/api/agent/eval, /api/agent/notebooks/{path}/run, MCP), which wait "
    "for the approval",
    "kernel": "use /api/agent/notebooks/{path}/kernel (or MCP notebook_kernel), which waits for the approval",
}


def gate_actions(resource: str, action: str) -> tuple[str, ...]:
    """The gate's actions ``action`` on ``resource`` performs on one of jupyter_server's routes."""
    return GATED.get((resource, action), ())


def _class_names(handler: Any) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(handler).__mro__}


def request_paths(handler: Any, names: set[str]) -> list[str] | None:
    """The paths a request names (its URL's path, and where a contents copy or rename leads), or None
    when the route names a file in a way that cannot be checked. An empty list: this extension's own
    routes whose services check every path they are given (the MCP tools)."""
    kwargs = getattr(handler, "path_kwargs", None) or {}
    args = getattr(handler, "path_args", None) or []
    paths: list[str] = []
    if isinstance(kwargs.get("path"), str):
        paths.append(kwargs["path"])
    elif names & (FILE_HANDLERS | COLLABORATION_PATH_HANDLERS) and args and isinstance(args[0], str):
        paths.append(args[0])
    elif names & ROOM_HANDLERS:
        path = room_path(handler, args[0] if args and isinstance(args[0], str) else "")
        if path is None:
            return None
        paths.append(path)
    elif AGENT_HANDLER in names:
        return []
    else:
        return None
    if CONTENTS_HANDLER in names and handler.request.method in ("POST", "PATCH") and handler.request.body:
        try:
            body = json.loads(handler.request.body)
        except ValueError:
            body = None  # the route answers 400 itself
        if isinstance(body, dict):
            paths += [body[k] for k in ("copy_from", "path") if isinstance(body.get(k), str)]
    return paths


def room_path(handler: Any, room_id: str) -> str | None:
    """The file a collaboration room edits (``format:type:file id``, the file id through the server's
    ``file_id_manager``), or None when the room is no document's (awareness) or its id is unknown."""
    parts = room_id.split(":", 2)
    manager = handler.settings.get("file_id_manager")
    if len(parts) != 3 or manager is None:
        return None
    path = manager.get_path(parts[2])
    return path if isinstance(path, str) else None


def agent_action(names: set[str], action: str) -> str:
    """The action an agent needs for ``action`` on this route: a collaboration room is written through."""
    return "write" if ROOM_WEBSOCKET in names else action


class AgentAuthorizer(Authorizer):
    """Applies agent tokens' scopes and paths on every route, then asks the wrapped authorizer.

    Enable with ``c.ServerApp.authorizer_class = "jupyter_agent_tools.auth.AgentAuthorizer"`` (with
    ``AgentIdentityProvider``); a deployment's own authorizer moves to ``c.AgentAuthorizer.authorizer_class``.
    """

    applies_agent_scopes = True  # AgentIdentityProvider accepts agent tokens only with such an authorizer

    authorizer_class = Type(
        default_value=AllowAllAuthorizer,
        klass=Authorizer,
        help="The authorizer asked for every request: alone for users that are not agents, after the "
        "token's scopes and paths for agents (what ServerApp.authorizer_class would be without agents).",
    ).tag(config=True)

    inner = Instance(Authorizer, help="The wrapped authorizer (built from authorizer_class).")

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.inner = self.authorizer_class(
            parent=self.parent, log=self.log, identity_provider=self.identity_provider
        )

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> Any:
        if not isinstance(user, AgentUser):
            return self.inner.is_authorized(handler, user, action, resource)
        names = _class_names(handler)
        action = agent_action(names, action)
        problem = refusal(user.scopes, resource, action)
        if FORK_HANDLER in names:
            problem = "agent tokens cannot use collaboration forks"
        own_route = AGENT_HANDLER in names  # this extension's routes and MCP ask the gate themselves
        policy = handler.settings.get(APPROVALS_SETTING)
        gates = () if own_route or policy is None else gate_actions(resource, action)
        # the paths a request names (a contents body is parsed for them) only where they are checked
        checked = resource in PATH_RESOURCES
        paths = request_paths(handler, names) if checked else []
        climbing = [p for p in paths or () if normalize(p) is None]
        if problem is None and climbing and not own_route:
            # ``../<root name>/x`` is x, but whether it answers would tell the agent the root's name
            self._record(handler, user, action, resource, "path above the root")
            raise web.HTTPError(404, f"No such file or directory: {climbing[0]}")
        if problem is None and names & ROOM_HANDLERS and not paths:
            problem = "agent tokens can join only a notebook's or a file's collaboration room"
        if problem is None and user.path_scope is not None and resource in PATH_RESOURCES:
            if paths is None:
                problem = "this route names files in a way the agent token's paths cannot be checked against"
            else:
                root = getattr(getattr(handler, "contents_manager", None), "root_dir", None)
                outside = [p for p in paths if not user.path_scope.allows(p, root)]
                if outside:
                    self._record(handler, user, action, resource, "path outside the token's paths")
                    raise web.HTTPError(404, _not_found(handler, outside[0], names))
        if problem is None and gates:
            problem = self._gate(policy, user, gates, paths if resource in PATH_RESOURCES else None)
        if problem is None:
            return self.inner.is_authorized(handler, user, action, resource)
        if IDENTITY_HANDLER in names:  # /api/me asks which permissions the user has: an answer, not a refusal
            return False
        self._record(handler, user, action, resource, problem)
        message = f"Agent {user.agent!r} may not {action} on resource {resource!r}: {problem}."
        missing = needed(resource, action) is not None and "scope" in problem and FORK_HANDLER not in names
        reason = REFUSED_MISSING_SCOPE if missing else REFUSED_NOT_FOR_AGENTS
        raise web.HTTPError(403, message + " Nothing was done.", reason=reason)

    def _gate(
        self, policy: Any, user: AgentUser, gates: tuple[str, ...], paths: list[str] | None
    ) -> str | None:
        """Why the approval policy closes this route of jupyter_server's to ``user``, or None.

        These routes cannot wait for the person, so ``ask`` refuses like ``deny`` (naming the rule and
        the agent route that asks instead). ``paths`` are the files the route names (each placed, as the
        policy places every path); None when it names none (a kernel, a session, a terminal): then any
        rule that may ask or deny the action somewhere closes the route (fail closed)."""
        ask: frozenset[str] = user.ask
        if paths is None:
            for gate in gates:
                if policy.gated(user.username, gate, ask):
                    return (
                        f"the approval policy makes this agent ask the person before the {gate!r} action "
                        f"(or denies it), and this route cannot ask: {INSTEAD[gate]}"
                    )
            return None
        for path in paths:
            gate, found = policy.strictest(user.username, gates, path, ask)
            if found.decision == "deny":
                return f"the approval policy denies the {gate!r} action on {path} ({found.because})"
            if found.decision == "ask":
                return (
                    f"the approval policy makes this agent ask the person before the {gate!r} action on "
                    f"{path} ({found.because}), and this route cannot ask: {INSTEAD[gate]}"
                )
        return None

    def _record(self, handler: Any, user: AgentUser, action: str, resource: str, reason: str) -> None:
        metrics.AGENT_REQUESTS.labels(agent=user.agent, outcome="refused").inc()
        audit = handler.settings.get(AUDIT_SETTING)
        if audit is None:
            return
        audit.refused(
            route=getattr(handler, "route_name", None) or type(handler).__name__,
            method=handler.request.method or "",
            action=action,
            resource=resource,
            user=user.username,
            reason=reason,
        )


def _not_found(handler: Any, path: str, names: set[str]) -> str:
    if names & ROOM_HANDLERS:  # named by its id: the path it leads to is not the agent's to know
        return f"No such collaboration room: {(getattr(handler, 'path_args', None) or [''])[0]}"
    shown = normalize(path) or path
    if AGENT_HANDLER in names:
        return f"Notebook not found: {shown}"
    return f"No such file or directory: {shown}"
