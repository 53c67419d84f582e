"""Who must ask the person before acting: the approval rules and their decision (pure, no I/O).

An action class is derived by the server from the route, never from what a client says:

- ``read``: reads of notebooks, files, sessions, runs, changes;
- ``edit``: notebook edits of every action (create, replace, clear_outputs included), undo, file writes;
- ``execute``: eval in any mode, notebook runs, insert-and-run, eval with ``notebook``;
- ``kernel``: interrupt, restart or shut down a notebook's kernel, delete a session.

A rule is ``{"who": "agent:*" | "agent:NAME" | "*", "actions": [...], "paths": [globs] (optional),
"decision": "allow" | "ask" | "deny"}``. Of the rules that match a request, ``deny`` wins over ``ask``,
``ask`` over ``allow``; a request no rule matches is allowed. An agent token's own ``ask`` list (set when
it was created) acts as one more ``ask`` rule for that agent.

A request's path is matched where it is (:func:`jupyter_agent_tools.auth.paths.place`: as written and
where the file system leads it); a path that cannot be placed is matched by every rule that has paths,
so it gets the strictest decision those rules give (fail closed). ``read`` is never asked (a read is
answered at once, it cannot wait for a person): a ``read`` rule allows or denies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..audit.context import AGENT_PREFIX
from ..auth.paths import GlobError, PathScope
from ..schemas import APPROVAL_ACTIONS as ACTIONS

DECISIONS = ("allow", "ask", "deny")
# The order decisions win in: a deny is never overruled, an ask only by a deny.
_STRENGTH = {"allow": 0, "ask": 1, "deny": 2}
MAX_RULES = 200
# What a request names: None, no file (an eval in a session); else the root-relative paths it is at
# (``auth.paths.place``); an empty tuple, a file that cannot be placed (matched by every rule with paths).
Places = tuple[str, ...] | None
UNPLACED: tuple[str, ...] = ()


class RuleError(ValueError):
    """A rule that cannot be used; the message says which and how to fix it."""


@dataclass(frozen=True)
class Rule:
    """One parsed rule of ``c.ApprovalPolicy.rules``."""

    who: str
    actions: frozenset[str]
    decision: str
    paths: PathScope | None = None
    index: int = 0

    def matches(self, identity: str, action: str, places: Places) -> bool:
        if action not in self.actions or not who_matches(self.who, identity):
            return False
        if self.paths is None:
            return True
        if places is None:
            return False
        return places == UNPLACED or any(self.paths.matches(p) for p in places)

    def describe(self) -> str:
        """The rule as an admin wrote it, e.g. ``rule 2 (deny edit on prod/**)``."""
        where = f" on {', '.join(self.paths.globs)}" if self.paths is not None else ""
        return f"rule {self.index} ({self.decision} {','.join(sorted(self.actions))} for {self.who}{where})"


@dataclass(frozen=True)
class Verdict:
    """A decision and what made it: the rule (or the token's own ``ask``), for messages that name it."""

    decision: str
    because: str = ""


def who_matches(who: str, identity: str) -> bool:
    """``*`` is anyone; ``agent:*`` any agent identity; otherwise the identity itself."""
    if who == "*":
        return True
    if who == AGENT_PREFIX + "*":
        return identity.startswith(AGENT_PREFIX)
    return who == identity


def parse_actions(raw: Any, where: str) -> frozenset[str]:
    """A list of action classes (or one comma-separated string), each one of :data:`ACTIONS`."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)) or not items:
        raise RuleError(f"{where}: 'actions' must be a non-empty list of {', '.join(ACTIONS)}")
    actions = {str(item).strip() for item in items}
    unknown = sorted(actions - set(ACTIONS))
    if unknown:
        raise RuleError(f"{where}: unknown action {', '.join(map(repr, unknown))}; use {', '.join(ACTIONS)}")
    return frozenset(actions)


def parse_rule(raw: Any, index: int) -> Rule:
    where = f"rule {index}"
    if not isinstance(raw, Mapping):
        raise RuleError(f"{where}: a rule is a dict with 'who', 'actions', 'decision' (and 'paths')")
    unknown = sorted(set(raw) - {"who", "actions", "paths", "decision"})
    if unknown:
        raise RuleError(f"{where}: unknown field {', '.join(map(repr, unknown))}")
    who = raw.get("who", "agent:*")
    if not isinstance(who, str) or not who or (who != "*" and not who.startswith(AGENT_PREFIX)):
        raise RuleError(f"{where}: 'who' must be '*', 'agent:*' or 'agent:NAME', got {who!r}")
    decision = raw.get("decision")
    if decision not in DECISIONS:
        raise RuleError(f"{where}: 'decision' must be one of {', '.join(DECISIONS)}, got {decision!r}")
    paths = raw.get("paths")
    scope = None
    if paths is not None:
        if not isinstance(paths, (list, tuple)) or not all(isinstance(p, str) for p in paths) or not paths:
            raise RuleError(f"{where}: 'paths' must be a non-empty list of globs")
        try:
            scope = PathScope(paths)
        except GlobError as e:
            raise RuleError(f"{where}: {e}") from None
    actions = parse_actions(raw.get("actions"), where)
    if decision == "ask" and "read" in actions:
        raise RuleError(
            f"{where}: 'read' cannot be asked (a read is answered at once and cannot wait for a person): "
            "allow or deny it"
        )
    return Rule(who=who, actions=actions, decision=decision, paths=scope, index=index)


def parse_rules(raw: Iterable[Any]) -> tuple[Rule, ...]:
    rules = list(raw)
    if len(rules) > MAX_RULES:
        raise RuleError(f"at most {MAX_RULES} rules, got {len(rules)}")
    return tuple(parse_rule(rule, i) for i, rule in enumerate(rules))


def verdict(
    rules: Iterable[Rule],
    identity: str,
    action: str,
    places: Places | str,
    token_ask: frozenset[str] = frozenset(),
) -> Verdict:
    """``allow``, ``ask`` or ``deny`` for ``identity`` doing ``action`` at ``places`` (None: no file;
    :data:`UNPLACED`: a file that cannot be placed), and the rule that decided it."""
    if isinstance(places, str):
        places = (places,)  # one path, placed already
    found = Verdict("ask", "the agent token asks for it") if action in token_ask else Verdict("allow")
    for rule in rules:
        if _STRENGTH[rule.decision] > _STRENGTH[found.decision] and rule.matches(identity, action, places):
            found = Verdict(rule.decision, rule.describe())
            if rule.decision == "deny":
                break
    if action == "read" and found.decision == "ask":  # a token made before reads could not be asked
        return Verdict("deny", f"{found.because}, and a read cannot wait for a person")
    return found


def strictest(found: Iterable[tuple[str, Verdict]]) -> tuple[str, Verdict]:
    """Of the verdicts on the classes one action is (``(class, verdict)`` pairs; a run with ``ops``:
    execute and edit), the strictest and its class (the first of equals)."""
    return max(found, key=lambda pair: _STRENGTH[pair[1].decision])


EVERYWHERE = PathScope(["**"])


def read_denials(rules: Iterable[Rule], identity: str, token_ask: frozenset[str]) -> tuple[PathScope, ...]:
    """The paths ``deny read`` rules hide from ``identity`` (a rule without paths: everything; a token
    made asking for reads, which cannot wait for a person: everything too)."""
    hidden = [
        rule.paths or EVERYWHERE
        for rule in rules
        if rule.decision == "deny" and "read" in rule.actions and who_matches(rule.who, identity)
    ]
    if "read" in token_ask:
        hidden.append(EVERYWHERE)
    return tuple(hidden)


def decide(
    rules: Iterable[Rule],
    identity: str,
    action: str,
    places: Places | str,
    token_ask: frozenset[str] = frozenset(),
) -> str:
    """``allow``, ``ask`` or ``deny`` (see :func:`verdict`)."""
    return verdict(rules, identity, action, places, token_ask).decision
