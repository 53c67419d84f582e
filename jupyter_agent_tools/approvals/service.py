"""The approval gate: who must ask, the requests waiting for the person, and their decisions.

One owner for an approval's life: :class:`ApprovalPolicy` creates a request (``pending``), and only it moves
it to ``approved``, ``denied``, ``expired`` (after ``timeout``) or ``withdrawn`` (the agent's call that asked
went away before the person decided). A waiting request wakes on the decision
(an ``asyncio.Event``, no polling). "Approve for N seconds" grants that agent the same action on the same
notebook until then: later requests it covers are approved at once, each still recorded. Only a person
decides: an agent identity (``agent:NAME``) is refused whatever its scopes.

What a request shows is bounded (``max_detail_bytes``): a larger description keeps what fits, its longest
texts cut with a marker; the request's ``truncated`` and its summary say how much the person does not see.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from traitlets import Dict, Float, Instance, Int, List, TraitError, Unicode, default, validate

from ..audit import NO_AUDIT, Audit
from ..audit.context import current_token, set_approver
from ..auth.paths import PathScope, place
from ..errors import RETRY_AFTER_MOMENT, AgentToolsError, Conflict, NotFound, Unavailable
from ..service import Service, at_least, in_range, trait_name
from ..stores import AgentStores, Worker, store_options
from .policy import (
    AGENT_PREFIX,
    EVERYWHERE,
    UNPLACED,
    Places,
    Rule,
    RuleError,
    Verdict,
    parse_rules,
    read_denials,
    strictest,
    verdict,
    who_matches,
)
from .records import Approval, ApprovalFile, clip, size_text

T = TypeVar("T")
ALLOW = Verdict("allow")
RECENT = 100  # decided requests the list answers with (newest first)
MIB = 1024 * 1024
MIN_DETAIL_BYTES = 4096
MIN_FILE_DETAILS = 8  # max_bytes holds at least this many requests of max_detail_bytes
STOP_WAIT = 5.0  # seconds stop(), called off the event loop, waits for the loop to release the waiters


class Forbidden(AgentToolsError):
    """The caller may not do this, whatever it sends (403)."""

    status = 403


class TooManyPending(AgentToolsError):
    """An agent already has as many requests waiting as it may (429)."""

    status = 429


class TooLarge(AgentToolsError):
    """What an action would do is too large to show the person, even cut (413)."""

    status = 413


@dataclass
class _Waiting:
    approval: Approval
    decided: asyncio.Event
    expiry: asyncio.TimerHandle | None = None
    token: str | None = None  # the id of the agent token that asked (what its revocation withdraws)


class ApprovalPolicy(Service):
    """Rules for what agents must ask the person first, and the requests waiting for a decision."""

    _parsed: tuple[Rule, ...]  # the rules, parsed when set

    rules = List(
        Dict(),
        default_value=[],
        help="Who must ask before acting: a list of {'who': 'agent:*' | 'agent:NAME' | '*', 'actions': "
        "[read, edit, execute, kernel], 'paths': [globs] (optional), 'decision': 'allow' | 'ask' | 'deny'}. "
        "Of the rules that match, deny wins over ask, ask over allow; nothing matched: allow. An agent "
        "token created with --ask adds its own.",
    ).tag(config=True)
    timeout = Float(
        600.0,
        help="Seconds a request waits for the person's decision; then it expires (as denied).",
    ).tag(config=True)
    wait = Float(
        30.0,
        help="Seconds an agent's request waits for the decision by default (its 'approval_wait' may say "
        "otherwise, up to timeout); past it the request answers 202 with the approval's id.",
    ).tag(config=True)
    max_pending_per_agent = Int(
        20,
        help="Requests one agent may have waiting at once; one more answers 429.",
    ).tag(config=True)
    max_for_seconds = Float(
        8 * 3600.0,
        help="Longest 'approve for N seconds' grant the person may give.",
    ).tag(config=True)
    hub_decider_scopes = List(
        Unicode(),
        default_value=[],
        help="On a JupyterHub single-user server, the hub scopes (e.g. a custom scope "
        "'custom:agent-approvals') whose holders may decide approvals with a hub API token. Empty: only the "
        "person's browser session through the hub's login decides (an agent may hold a hub API token).",
    ).tag(config=True)
    max_detail_bytes = Int(
        MIB,
        help="Bytes of JSON a request's description (code, cells, diff) may take, as stored and shown. A "
        "larger one keeps what fits: its longest texts are cut, each ending with '[truncated: N bytes not "
        "shown]', and the request's 'truncated' and summary say how much the person does not see. One whose "
        "structure alone does not fit (thousands of cells) is refused (413). Between 4096 and 67108864.",
    ).tag(config=True)
    max_bytes = Int(
        64 * MIB,
        help="Bytes the approvals file (with its write-ahead log) may take; past it the oldest decided "
        "requests are pruned first (pending ones never). At least 8 times max_detail_bytes.",
    ).tag(config=True)
    db_path = Unicode(
        help="The SQLite file of approval requests and decisions. Empty: agent_tools_approvals.db in "
        "AgentStores.state_dir (the Jupyter data directory by default).",
    ).tag(config=True)
    audit = Instance(Audit, help="Told each request and decision (the approval event, the metric).")
    root_dir = Unicode(
        None,
        allow_none=True,
        help="The contents root on a local disk, where paths are placed (symlinks followed) before rules "
        "match them; None: paths are matched as written (a path above the root cannot be placed).",
    )

    @default("audit")
    def _default_audit(self) -> Audit:
        return NO_AUDIT

    @default("db_path")
    def _default_db_path(self) -> str:
        return AgentStores(parent=self).path("agent_tools_approvals.db")

    @validate("db_path")
    def _valid_db_path(self, proposal: Any) -> str:
        return str(proposal["value"]) or self._default_db_path()

    @validate("rules")
    def _valid_rules(self, proposal: Any) -> list[dict[str, Any]]:
        try:
            self._parsed = parse_rules(proposal["value"])
        except RuleError as e:
            raise TraitError(f"{trait_name(proposal)}: {e}") from None
        return list(proposal["value"])

    @validate("timeout", "wait", "max_for_seconds")
    def _valid_seconds(self, proposal: Any) -> float:
        return float(at_least(proposal, 0, strict=True))

    @validate("max_pending_per_agent")
    def _valid_max_pending(self, proposal: Any) -> int:
        return int(at_least(proposal, 1))

    @validate("max_detail_bytes")
    def _valid_max_detail_bytes(self, proposal: Any) -> int:
        return in_range(proposal, MIN_DETAIL_BYTES, 64 * MIB)

    @validate("max_bytes")
    def _valid_max_bytes(self, proposal: Any) -> int:
        return in_range(proposal, MIN_FILE_DETAILS * MIN_DETAIL_BYTES, 1024**4)

    def __init__(self, **kwargs: Any):
        self._parsed = ()
        super().__init__(**kwargs)
        if self.max_bytes < MIN_FILE_DETAILS * self.max_detail_bytes:
            raise TraitError(
                f"ApprovalPolicy.max_bytes ({self.max_bytes}) must be at least {MIN_FILE_DETAILS} times "
                f"ApprovalPolicy.max_detail_bytes ({self.max_detail_bytes})"
            )
        self._options = store_options(self)
        self._file = ApprovalFile(self.db_path, self.max_bytes, self._options, self.log)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker = Worker("agent-tools-approvals")
        self._waiting: dict[int, _Waiting] = {}
        # (token id, agent, action, path) -> (until, who granted it): the person's 'approve for N seconds',
        # for the agent token that asked (a new token of the same name has none).
        self._grants: dict[tuple[str | None, str, str, str | None], tuple[float, str]] = {}
        self._ended_tokens: dict[str, str] = {}  # agent tokens that ended (revoked, expired) -> why
        self._asking: dict[str, int] = {}  # agent -> requests being written (not yet waiting)
        self._claimed: dict[int, float] = {}  # approved requests a retried call took: id -> expiry
        self._followups: set[asyncio.Future[None]] = set()  # actions answered 202, done once approved

    # -- life ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the file; requests a stopped server left pending end expired (nothing runs unapproved);
        another live server's are left alone."""

        def open_file() -> int:
            expired = self._file.expire_pending(time.time())
            self._file.fit()
            return expired

        self._loop = asyncio.get_running_loop()
        expired = await self._run(open_file)
        if self.db_path != ":memory:":
            self._worker.every(self._options.heartbeat, self._file.beat)
        if expired:
            self.log.info("%d approval request(s) left pending by a stopped server expired", expired)

    def stop(self) -> None:
        """End the waits and close the file; callable from any thread (the server stops services in
        worker threads): the waiters and timers are released on the event loop, which owns them."""
        loop = self._loop
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if loop is None or on_loop or loop.is_closed() or not loop.is_running():
            self._release()
        else:
            released = threading.Event()

            def release() -> None:
                try:
                    self._release()
                finally:
                    released.set()

            try:
                loop.call_soon_threadsafe(release)
            except RuntimeError:  # the loop closed meanwhile: nothing waits on it any more
                pass
            else:
                released.wait(STOP_WAIT)
        closed = self._worker.submit(self._file.close)  # (its pending requests expire: nothing approves them)
        self._worker.shutdown(wait=False)
        # broad: closing the file at stop (a timeout, SQLite or OS error) must not stop the server's shutdown
        with contextlib.suppress(Exception):
            closed.result(timeout=STOP_WAIT)

    def _release(self) -> None:
        """Cancel the follow-ups and wake every waiter (on the event loop)."""
        for task in list(self._followups):
            task.cancel()
        for waiting in list(self._waiting.values()):
            if waiting.expiry is not None:
                waiting.expiry.cancel()
            waiting.decided.set()
        self._waiting.clear()

    async def _run(self, func: Callable[..., T], *args: Any) -> T:
        return await self._worker.run(func, *args)

    async def _insert(self, approval: Approval) -> None:
        """Write a new request and give it the id SQLite chose; 503 when it cannot be written (nothing is
        asked that the file does not hold: its id would be no one's)."""
        try:
            approval_id = await self._run(self._file.insert, approval)
        except Exception as e:
            # broad: the records file failing (SQLite, disk, locked or corrupt) keeps the request in memory;
            # logged
            self.log.warning("an approval request was not written to %s: %s", self.db_path, e)
            raise Unavailable(
                f"The approval request could not be recorded ({self.db_path}: {e}); nothing was done. Try "
                "again in a moment.",
                retry_after=RETRY_AFTER_MOMENT,
            ) from None
        if approval_id is None:
            raise Unavailable(
                f"The approvals file is at its max_bytes ({size_text(self.max_bytes)}) with requests "
                "waiting for the person: decide them (GET /api/agent/approvals) before asking again. "
                "Nothing was done.",
                retry_after=RETRY_AFTER_MOMENT,
            )
        approval.id = approval_id

    def _persist(self, approval: Approval) -> None:
        """Write the record's change in the worker; a failure is logged (the decision still holds)."""

        def save() -> None:
            try:
                if not self._file.update(approval):
                    self.log.warning(
                        "approval %d was not written to %s: it is gone", approval.id, self.db_path
                    )
            except Exception as e:
                # broad: the records file failing (SQLite, disk, locked or corrupt) keeps the decision in
                # memory; logged
                self.log.warning("approval %d was not written to %s: %s", approval.id, self.db_path, e)

        self._worker.submit(save)  # (after stop(): not written, as the server stops)

    # -- the policy ------------------------------------------------------------------------------

    def places(self, path: str | None) -> Places:
        """Where ``path`` is as the rules match it (``auth.paths.place``); None: no file; a path that
        cannot be placed: :data:`UNPLACED` (every rule with paths matches it: fail closed)."""
        if path is None:
            return None
        return place(path, self.root_dir) or UNPLACED

    def placed(self, path: str | None) -> str | None:
        """The one name of ``path`` for records and grants: where the file system leads it."""
        where = self.places(path)
        return where[-1] if where else path

    def verdict(
        self, identity: str, action: str, path: str | None, token_ask: frozenset[str] = frozenset()
    ) -> Verdict:
        """What ``identity`` must do before ``action`` on ``path`` (None: no file), and which rule says so.
        The one decision of the agent limits: every door (the agent routes, MCP, jupyter_server's own
        routes through ``AgentAuthorizer``) asks it."""
        if not self._parsed and not token_ask:
            return ALLOW  # the default: no rule, no token asking (no cost on the hot path)
        return verdict(self._parsed, identity, action, self.places(path), token_ask)

    def strictest(
        self,
        identity: str,
        actions: tuple[str, ...],
        path: str | None,
        token_ask: frozenset[str] = frozenset(),
    ) -> tuple[str, Verdict]:
        """The strictest :meth:`verdict` of the classes one action is (a run with ``ops``: execute and
        edit), and the class it is for."""
        return strictest((action, self.verdict(identity, action, path, token_ask)) for action in actions)

    def reach(
        self, identity: str, scope: PathScope | None, token_ask: frozenset[str] = frozenset()
    ) -> PathScope | None:
        """What an agent may read: its token's path globs (None: everything) less what ``deny read``
        rules hide from it. Every door applies it as it applies the token's paths (hidden: 404)."""
        if not self._parsed and "read" not in token_ask:
            return scope
        hidden = read_denials(self._parsed, identity, token_ask)
        if not hidden:
            return scope
        return (scope or EVERYWHERE).hiding(hidden)

    def decision(self, identity: str, action: str, path: str | None, token_ask: frozenset[str]) -> str:
        """``allow``, ``ask`` or ``deny``: what ``identity`` must do before ``action`` on ``path``."""
        return self.verdict(identity, action, path, token_ask).decision

    def gated(self, identity: str, action: str, token_ask: frozenset[str]) -> bool:
        """Whether ``identity`` may have to ask for ``action`` somewhere (on any path): the routes that
        cannot ask (the kernels' websocket, terminals) are closed to it then."""
        if action in token_ask:
            return True
        return any(
            rule.decision != "allow" and action in rule.actions and who_matches(rule.who, identity)
            for rule in self._parsed
        )

    # -- requests --------------------------------------------------------------------------------

    async def request(
        self,
        *,
        agent: str,
        door: str,
        action: str,
        path: str | None,
        summary: str,
        details: dict[str, Any],
    ) -> Approval:
        """A new request (pending), or one approved at once by a grant the person gave ("approve for").
        Its details are bounded first: 413 when they cannot be (see ``max_detail_bytes``). (Cutting
        megabytes takes tens of milliseconds, once per request; reading the list costs nothing more.)"""
        token = current_token()
        if token is not None and token in self._ended_tokens:  # a call that was past the door when it ended
            raise Forbidden(f"{agent} cannot ask any more: {self._ended_tokens[token]}.")
        bounded = clip(details, self.max_detail_bytes)
        if bounded is None:
            raise TooLarge(
                f"What this {action} would do is too large to show the person for approval (more than "
                f"{size_text(self.max_detail_bytes)} even with its texts cut: "
                "ApprovalPolicy.max_detail_bytes). Nothing was done: split it into smaller requests (fewer "
                "cells or ops at a time)."
            )
        details, truncated = bounded
        if truncated:
            summary = f"{summary} [{size_text(truncated)} not shown]"
        now = time.time()
        approval = Approval(
            id=0,  # (given by the file)
            agent=agent,
            door=door,
            action=action,
            path=path,
            summary=summary,
            details=details,
            created=now,
            expires=now + self.timeout,
            truncated=truncated,
        )
        grants = [self._grants.get((token, agent, a, path), (0.0, "")) for a in approval.actions]
        until, granted_by = min(grants)  # a grant covers a request only if it covers all it is
        if until > now:
            approval.state = "approved"
            approval.decided = now
            approval.decided_by = granted_by
            approval.reason = "approved for a while by the person"
            await self._insert(approval)
            self.audit.approval(approval.to_json(with_details=False), "approved")
            return approval
        pending = sum(1 for w in self._waiting.values() if w.approval.agent == agent)
        pending += self._asking.get(agent, 0)
        if pending >= self.max_pending_per_agent:
            raise TooManyPending(
                f"{agent} already has {pending} requests waiting for the person's decision (at most "
                f"{self.max_pending_per_agent}): wait for them to be decided (GET /api/agent/approvals)."
            )
        self._asking[agent] = self._asking.get(agent, 0) + 1
        try:
            await self._insert(approval)
        finally:
            self._asking[agent] -= 1
            if not self._asking[agent]:
                del self._asking[agent]
        if token is not None and token in self._ended_tokens:  # the token ended while it was written
            approval.state, approval.decided, approval.reason = (
                "withdrawn",
                time.time(),
                self._ended_tokens[token],
            )
            self._persist(approval)
            raise Forbidden(f"{agent} cannot ask any more: {self._ended_tokens[token]}.")
        approval.listed_details  # noqa: B018 (the list's preview, made once now rather than at a read)
        waiting = _Waiting(approval, asyncio.Event(), token=token)
        waiting.expiry = asyncio.get_running_loop().call_later(self.timeout, self._expire, approval.id)
        self._waiting[approval.id] = waiting
        self._persist(approval)
        self.audit.approval(approval.to_json(with_details=False), "requested")
        return approval

    async def wait_for(self, approval: Approval, seconds: float) -> Approval:
        """The approval once decided, or as it is after ``seconds`` (still pending)."""
        waiting = self._waiting.get(approval.id)
        if waiting is None or approval.state != "pending":
            return approval
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(waiting.decided.wait(), timeout=max(0.0, seconds))
        return approval

    def claim(self, approval: Approval) -> bool:
        """Take an approved request for the one call it approves; False when a call took it already (a
        2026-07-28 MCP client's retry carries a state that could be sent twice)."""
        now = time.time()
        for taken in [i for i, until in self._claimed.items() if until < now]:
            del self._claimed[taken]  # (a state past its approval's expiry is refused before this)
        if approval.id in self._claimed:
            return False
        self._claimed[approval.id] = approval.expires
        return True

    def when_approved(self, approval: Approval, apply: Callable[[], Awaitable[Any]]) -> None:
        """Do ``apply()`` once ``approval`` is approved (nothing when it is denied or expires); what came of
        it is kept as the approval's ``outcome``. For a request answered 202 (an edit, a kernel action)."""

        async def follow() -> None:
            await self.wait_for(approval, approval.expires - time.time() + 1.0)
            if approval.state != "approved":
                return
            set_approver(approval.decided_by)  # the ledger names who approved the change
            try:
                answer = await apply()
            except AgentToolsError as e:
                approval.outcome = {"status": e.status, "message": e.message, **e.extra}
            except Exception as e:
                # broad: the approved action is any route's work (edit, eval, run): its failure is the
                # approval's outcome
                self.log.exception("approved action %d failed", approval.id)
                approval.outcome = {"status": 500, "message": f"failed: {e}"}
            else:
                first = answer[0] if isinstance(answer, tuple) else answer
                message = first.get("message") if isinstance(first, dict) else None
                approval.outcome = {"status": 200, "message": message or "done"}
                if isinstance(first, dict) and isinstance(first.get("hash"), str):
                    approval.outcome["hash"] = first["hash"]
            self._persist(approval)

        task = asyncio.ensure_future(follow())
        self._followups.add(task)
        task.add_done_callback(self._followups.discard)

    def _expire(self, approval_id: int) -> None:
        self._end(approval_id, "expired", f"nobody decided within {self.timeout:g} s")

    def withdraw(self, approval: Approval, reason: str) -> bool:
        """End a pending request whose call went away before the person decided (``withdrawn``): it leaves
        the person's list and can no longer be decided. False when it was decided already."""
        return self._end(approval.id, "withdrawn", reason) is not None

    def withdraw_token(self, token: str, reason: str) -> int:
        """The agent token ``token`` (its id) ended (revoked, expired): its pending requests are withdrawn
        (approving them answers 409, nothing runs) and its grants dropped; how many were withdrawn."""
        self._ended_tokens[token] = reason
        self._grants = {key: grant for key, grant in self._grants.items() if key[0] != token}
        asked = [i for i, w in self._waiting.items() if w.token == token]
        return sum(1 for i in asked if self._end(i, "withdrawn", reason) is not None)

    def _end(
        self, approval_id: int, state: str, reason: str | None, by: str | None = None
    ) -> Approval | None:
        """Move a pending request to ``state``: waiters wake, the record is written, the event told."""
        waiting = self._waiting.pop(approval_id, None)
        if waiting is None:
            return None
        if waiting.expiry is not None:
            waiting.expiry.cancel()
        approval = waiting.approval
        approval.state = state
        approval.decided = time.time()
        approval.decided_by = by
        approval.reason = reason
        waiting.decided.set()
        self._persist(approval)
        self.audit.approval(approval.to_json(with_details=False), state)
        return approval

    # -- the person's side -----------------------------------------------------------------------

    def pending(self) -> list[Approval]:
        return [w.approval for w in sorted(self._waiting.values(), key=lambda w: w.approval.id)]

    async def get(self, approval_id: int) -> Approval:
        waiting = self._waiting.get(approval_id)
        if waiting is not None:
            return waiting.approval
        found = await self._run(self._file.get, approval_id)
        if found is None:
            raise NotFound(
                f"There is no approval request {approval_id} (GET /api/agent/approvals lists them)."
            )
        return found

    async def recent(self, agent: str | None = None) -> list[Approval]:
        """The latest decided requests (``agent``'s only, when given), newest first."""
        return await self._run(self._file.recent, RECENT, agent)

    async def decide(
        self,
        approval_id: int,
        decision: str,
        *,
        by: str,
        for_seconds: float | None = None,
        reason: str | None = None,
    ) -> Approval:
        """Approve or deny a pending request, as the person ``by``."""
        if by.startswith(AGENT_PREFIX):
            raise Forbidden(
                f"{by} is an agent: only a person decides an approval (in JupyterLab's Agents panel, or "
                "with the server's own token)."
            )
        waiting = self._waiting.get(approval_id)
        if waiting is None:
            done = await self.get(approval_id)  # 404 when unknown
            raise Conflict(
                f"Approval {approval_id} is already {done.state}"
                + (f" (by {done.decided_by})" if done.decided_by else "")
                + ": it cannot be decided again."
            )
        approval = waiting.approval
        if for_seconds is not None and decision == "approve":
            if not 0 < for_seconds <= self.max_for_seconds:
                raise AgentToolsError(
                    f"'for_seconds' must be between 1 and {self.max_for_seconds:g}, got {for_seconds:g}"
                )
            for action in approval.actions:
                self._grants[(waiting.token, approval.agent, action, approval.path)] = (
                    time.time() + for_seconds,
                    f"{by} (for {for_seconds:g} s, at approval {approval.id})",
                )
            approval.for_seconds = for_seconds
        self._end(approval_id, "approved" if decision == "approve" else "denied", reason, by)
        return approval
