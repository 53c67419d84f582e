"""Which paths the request being served may reach, for services that take a path from a request body.

The agent handlers set it after authentication (:meth:`AgentAPIHandler.prepare`), next to the acting
user: the path globs of an agent token, or None (no limit: the server's own token, a browser, a hub
user). The notebook store and the file listing ask :func:`path_allowed` for every path they are given
(the MCP tools name notebooks in their arguments, where the authorizer cannot see them); a path outside
answers 404, as if it did not exist. No Tornado here.
"""

from __future__ import annotations

from contextvars import ContextVar, Token

from ..audit.context import current_user
from .paths import PathScope

_PATHS: ContextVar[PathScope | None] = ContextVar("jupyter_agent_tools_paths", default=None)


def set_paths(scope: PathScope | None) -> Token[PathScope | None]:
    """Limit this task (and the tasks it starts) to ``scope`` (None: no limit)."""
    return _PATHS.set(scope)


def current_paths() -> PathScope | None:
    return _PATHS.get()


def path_allowed(path: str, root_dir: str | None = None) -> bool:
    """Whether the request being served may reach ``path`` (root-relative; symlinks followed under a
    local ``root_dir``)."""
    scope = _PATHS.get()
    return scope is None or scope.allows(path, root_dir)


# Whether the request being served is an agent token's (False: the server's own token, a person, the
# server's own work): an agent sees only its own sessions and artifacts and what its paths reach.
_AGENT: ContextVar[bool] = ContextVar("jupyter_agent_tools_agent", default=False)


def set_agent(agent: bool) -> Token[bool]:
    """Mark this task (and the tasks it starts) as an agent's request, or not."""
    return _AGENT.set(agent)


def may_see(owner: str | None, notebook: str | None = None) -> bool:
    """Whether the request being served may see a thing owned by ``owner`` (a session, an artifact) that
    belongs to ``notebook`` (if any): everyone but an agent sees all; an agent, its own things and those
    of notebooks inside its paths."""
    if not _AGENT.get():
        return True
    if owner is not None and owner == current_user():
        return True
    return notebook is not None and path_allowed(notebook)
