"""What an agent token's scopes allow: the scope each (resource, action) of the server needs (pure).

jupyter_server asks its authorizer an (action, resource) pair on every route (``@authorized``, and the
websockets of kernels, terminals and events); extensions ask theirs. An agent gets a pair only when one
of its scopes grants it; a pair no scope grants (shutting the server down, changing its config, emitting
events, managing agent tokens, any resource not listed here) is never an agent's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..schemas import TOKEN_NAME_PATTERN
from ..schemas import TOKEN_SCOPES as SCOPES

# A scope includes the scopes it implies: edit is read plus writing.
IMPLIED = {
    "read": frozenset({"read"}),
    "edit": frozenset({"read", "edit"}),
    "execute": frozenset({"execute"}),
}

# resource -> action -> the scope that grants it
RULES: dict[str, dict[str, str]] = {
    "contents": {"read": "read", "write": "edit"},  # /api/contents, /files, /view, this extension's notebooks
    "nbconvert": {"read": "read", "write": "read"},  # converting a notebook reads it
    "kernels": {"read": "read", "write": "execute", "execute": "execute"},  # eval, runs, /api/kernels
    "sessions": {"read": "read", "write": "execute"},  # creating or changing a session starts kernels
    "kernelspecs": {"read": "read"},
    "terminals": {"read": "execute", "write": "execute", "execute": "execute"},  # a shell runs code
    "events": {"read": "read", "execute": "read"},  # subscribing reads; emitting (write) is not an agent's
    "api": {"read": "read"},  # /api/status, /api/spec.yaml
    "config": {"read": "read"},
    # an agent reads its own approval requests; deciding (write) is a person's, never an agent's
    "agent_approvals": {"read": "read"},
    # an agent reads the focus the person shares with it; publishing it (write) is the person's browser's
    "agent_focus": {"read": "read"},
    # an agent points the person at something (open a notebook, reveal a cell): allow-listed UI actions
    "agent_ui": {"write": "read"},
}
# Resources whose routes name a file: an agent with path globs reaches only those inside them.
PATH_RESOURCES = frozenset({"contents", "nbconvert"})

_NAME = re.compile(TOKEN_NAME_PATTERN)


class ScopeError(ValueError):
    """Scopes or a name that cannot be used (the message says why)."""


def parse_scopes(scopes: Iterable[str]) -> frozenset[str]:
    """The scopes as stored (as given; ``edit`` implies ``read`` when checked). Raises :class:`ScopeError`
    for an unknown scope or none."""
    found = set()
    for scope in scopes:
        if scope not in SCOPES:
            raise ScopeError(f"unknown scope {scope!r}: the scopes are {', '.join(SCOPES)}")
        found.add(scope)
    if not found:
        raise ScopeError(f"a token needs at least one scope ({', '.join(SCOPES)})")
    return frozenset(found)


def effective(scopes: Iterable[str]) -> frozenset[str]:
    """The scopes with the ones they imply."""
    out: set[str] = set()
    for scope in scopes:
        out |= IMPLIED.get(scope, frozenset())
    return frozenset(out)


def needed(resource: str, action: str) -> str | None:
    """The scope that grants ``action`` on ``resource`` to an agent, or None when no scope does."""
    return RULES.get(resource, {}).get(action)


def refusal(scopes: frozenset[str], resource: str, action: str) -> str | None:
    """Why ``scopes`` (effective) do not allow ``action`` on ``resource``, or None when they do."""
    scope = needed(resource, action)
    if scope is None:
        return f"agent tokens are never allowed to {action} on resource {resource!r}"
    if scope not in scopes:
        return f"this needs the {scope!r} scope ({action} on {resource}), which the agent token does not have"
    return None


def check_name(name: str) -> str:
    """A token name as given, or :class:`ScopeError` saying what a name may be."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ScopeError(
            f"a token name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit; "
            f"got {name!r}"
        )
    return name
