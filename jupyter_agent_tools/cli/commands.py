"""What each subcommand does: read its inputs, call the client, hand the answer to the renderer, and
choose the exit code."""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import re
import shlex
import signal
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

from ..client import AgentAPIError, AgentClient, EvalEvent
from ..client.calls import pending_approval
from ..ledger.text import change_text, changes_text
from ..wire import REFUSED_MISSING_SCOPE, TOKEN_MAX_EXPIRES_IN, TOKEN_MIN_EXPIRES_IN
from . import exits
from .args import parse
from .cells import CodeCell, UsageError, parse_cell_ref, split_cells
from .discovery import ServerNotFound, find_server
from .render import NotebookCall, Renderer, RunPlan, approval_line, choose
from .render.plain import artifact_commands

Command = Callable[[AgentClient, argparse.Namespace, Renderer], int]


def _read_file(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read {name}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{name} is not UTF-8 text") from None


def eval_cells(args: argparse.Namespace) -> list[CodeCell]:
    """The cells of ``jupyter agent eval``: each ``-c`` is one; files and ``-`` are split at ``# %%``."""
    if args.code and args.files:
        raise UsageError("give either -c CODE (one or more) or files (or - for stdin), not both")
    if args.files.count("-") > 1:
        raise UsageError("- (stdin) can be given once")
    if args.code:
        return [CodeCell(code) for code in args.code]
    cells: list[CodeCell] = []
    for name in args.files:
        cells.extend(split_cells(_read_file(name)))
    if not cells:
        what = "the input has no code" if args.files else "nothing to run"
        raise UsageError(f"{what}: give -c CODE, a FILE (cells split at `# %%` lines), or - to read stdin")
    return cells


def _env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"-e wants KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def _run(renderer: Renderer, events: Generator[EvalEvent, None, None], plan: RunPlan) -> int:
    """Show a run's events; the exit code of its result. Leaving early (Ctrl-C) closes the stream, which
    makes the server cancel the run and interrupt the kernel."""
    with contextlib.closing(events):
        result = renderer.run(events, plan)
    return exits.for_result(result)


def _started(renderer: Renderer, answer: dict[str, Any]) -> int:
    """What ``--detach`` prints: the run's id and how to follow it."""
    run_id = answer["run_id"]
    renderer.done(
        f"Run {run_id} started ({answer['state']}); it goes on without this command.\n"
        f"Follow it: jupyter agent runs watch {run_id}   Stop it: jupyter agent runs cancel {run_id}",
        answer,
    )
    return exits.OK


def follow_approval(
    client: AgentClient,
    renderer: Renderer,
    pending: dict[str, Any],
    wait: float | None,
    call: NotebookCall | None = None,
) -> int:
    """A command the person must approve first, answered while it waits (``202``): say so as ``eval``
    does, wait for the decision (up to ``wait`` seconds; None: until it is decided or expires), and exit
    with what came of it (:func:`exits.for_approval`; a refused approved change as its error)."""
    approval_id = int(pending["approval_id"])
    try:
        approval = client.approval(approval_id)
    except AgentAPIError as e:  # (a token without the read scope cannot follow its requests)
        renderer.error(
            f"approval {approval_id} waits for the person; it cannot be followed: {describe_error(e)}"
        )
        return exits.PENDING
    renderer.note(
        approval_line(
            {
                "type": "approval",
                "state": "pending",
                "approval_id": approval_id,
                "summary": approval["summary"],
            }
        )
    )
    try:
        approval = client.wait_approval(approval_id, timeout=wait)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        approval = {**approval, "state": "pending"}
    state, by = approval["state"], approval.get("decided_by") or "the person"
    reason = f": {approval['reason']}" if approval.get("reason") else ""
    if state == "pending" or (state == "approved" and not approval.get("outcome")):
        now = (
            "is still pending; it is done once approved"
            if state == "pending"
            else "is approved, not yet done"
        )
        renderer.error(
            f"stopped waiting: approval {approval_id} ({approval['summary']}) {now}. Follow it: jupyter "
            f"agent approvals show {approval_id}",
            call,
        )
        return exits.PENDING
    if state == "denied":
        renderer.error(f"denied: {by} denied {approval['summary']}{reason}. Nothing was done.", call)
    elif state != "approved":
        renderer.error(
            f"approval {approval_id} ({approval['summary']}) {state}{reason}. Nothing was done.", call
        )
    if state != "approved":
        return exits.for_approval(state)
    outcome = approval["outcome"]
    status = int(outcome.get("status") or 200)
    if status >= 400:
        error = AgentAPIError(status, str(outcome.get("message")), outcome.get("reason"))
        renderer.error(f"approved by {by}, then refused: {describe_error(error)}", call)
        return exits.for_error(error)
    done = f"Approved by {by}: {outcome.get('message') or 'done'}"
    renderer.done(done + (f" Hash: {outcome['hash']}" if outcome.get("hash") else ""), approval)
    return exits.OK


def approval_exit(client: AgentClient, error: AgentAPIError) -> int:
    """The exit code of a failed call; a refused approval says whether it was denied or expired."""
    state = None
    approval_id = getattr(error, "approval_id", None)
    if error.reason == "approval_denied" and isinstance(approval_id, int):
        with contextlib.suppress(AgentAPIError):
            state = client.approval(approval_id).get("state")
    return exits.for_error(error, state)


def cmd_eval(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    cells = eval_cells(args)
    bodies = [cell.as_json() for cell in cells]
    options: dict[str, Any] = {
        "session": args.session,
        "mode": "per-call" if args.per_call else None,
        "reset": True if args.reset else None,
        "timeout": args.timeout,
        "cwd": args.cwd,
        "env": _env(args.env) or None,
        "kernel_name": args.kernel,
        "notebook": args.notebook,
    }
    if args.detach:
        return _started(renderer, client.detach_eval(bodies, **options))
    events = client.stream_eval(bodies, **options, raise_on_error=False)
    save = Path(args.save_images) if args.save_images else None
    return _run(renderer, events, RunPlan([cell.title for cell in cells], save, where=args.notebook))


def _content(args: argparse.Namespace) -> str:
    if args.stdin == "-":
        if args.content is not None or args.file is not None:
            raise UsageError("give one of --content, --file or -")
        return sys.stdin.read()
    if args.file is not None:
        return _read_file(args.file)
    if args.content is None:
        raise UsageError("the cell's source is required: --content TEXT, --file F, or - to read stdin")
    return str(args.content)


def notebook_op(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """The edit route's operation for ``nb edit|insert|delete|move|clear``, and the cell it names."""
    action = args.nb_command
    op: dict[str, Any] = {"action": "clear_outputs" if action == "clear" else action}
    cell: str | None = None
    if getattr(args, "cell", None) is not None:  # insert names its place with --at
        ref = parse_cell_ref(args.cell)
        op.update(ref.as_fields())
        cell = str(ref)
    if action == "replace":
        if args.old_file == "-" and args.new_file == "-":
            raise UsageError("- (stdin) can be given once: to --old-file or to --new-file")
        old = args.old if args.old_file is None else _read_file(args.old_file)
        new = args.new if args.new_file is None else _read_file(args.new_file)
        op.update(old=old, new=new, all=bool(args.all))
    if action in ("edit", "insert"):
        op["content"] = _content(args)
        if args.cell_type:
            op["cell_type"] = args.cell_type
    if action == "insert":
        if args.at is not None:
            op["cell_index"], cell = args.at, str(args.at)
        if args.new_id is not None:
            op["cell_id"] = args.new_id
    elif action == "move":
        op["to_index"] = args.to_index
    elif action == "clear" and args.all:
        op["all"], cell = True, "all"
    return op, cell


def cmd_nb(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    if args.nb_command == "show":
        return nb_show(client, args, renderer)
    if args.nb_command == "run":
        return nb_run(client, args, renderer)
    if args.nb_command == "output":
        return nb_output(client, args, renderer)
    if args.nb_command in ("log", "diff", "undo"):
        return nb_ledger(client, args, renderer)
    if args.nb_command == "create":
        return nb_create(client, args, renderer)
    if args.nb_command == "kernel":
        wait = 0 if args.action is not None else None  # (an action may need the person's approval)
        kernel = client.notebook_kernel(args.path, args.action, approval_wait=wait)
        if pending_approval(kernel) is not None:
            return follow_approval(client, renderer, kernel, args.approval_wait)
        text = kernel.get("message") or (
            f"Kernel of {kernel['path']}: {kernel['state']}"
            + (f", {kernel['kernel_name']} ({kernel['kernel_id']})" if kernel["kernel_id"] else "")
            + (f", execution count {kernel['execution_count']}" if kernel["execution_count"] else "")
            + (", a person is connected" if kernel["person_connected"] else "")
        )
        renderer.done(text, kernel)
        return exits.OK
    op, cell = notebook_op(args)
    if getattr(args, "run", False):  # nb edit/insert --run: the run route applies the op, then runs it
        if args.upgrade or args.repair:
            raise UsageError("--run does not take --upgrade or --repair: edit the notebook first")
        events = client.stream_run_notebook(
            args.path, ops=[op], expected_hash=args.expected_hash, raise_on_error=False
        )
        return _run(renderer, events, RunPlan(None, None))
    call = NotebookCall(op["action"], args.path, cell, op.get("cell_type"))
    try:
        answer = client.edit_notebook(
            args.path,
            op,
            expected_hash=args.expected_hash,
            upgrade=args.upgrade,
            repair=args.repair,
            approval_wait=0,  # asked, the person's decision is awaited here, saying so (follow_approval)
        )
    except AgentAPIError as e:
        renderer.error(describe_error(e), call)
        return approval_exit(client, e)
    if pending_approval(answer) is not None:
        return follow_approval(client, renderer, dict(answer), args.approval_wait, call)
    renderer.notebook_change(call, dict(answer), args.expand)
    return exits.OK


def nb_create(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    cells = [{"cell_type": kind, "source": source} for kind, source in args.new_cells or []]
    answer = client.create_notebook(args.path, cells, kernel_name=args.kernel, parents=args.parents)
    renderer.note(str(answer.get("message") or f"Created {args.path}."))
    renderer.notebook(answer, list(answer.get("cells") or []), False, args.expand)
    return exits.OK


def cmd_files(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    answer = client.list_files(
        args.path,
        glob=args.glob,
        max_depth=args.max_depth,
        recursive=args.recursive,
        start=args.start,
        limit=args.limit,
        ignored=args.ignored,
    )
    renderer.listing(files_text(answer), answer)  # --json: the answer
    return exits.OK


def files_text(answer: dict[str, Any]) -> str:
    """A page of ``files``: one line per entry (path, size, modification time), then how to go on."""
    lines = []
    for entry in answer.get("entries") or []:
        modified = str(entry.get("last_modified") or "")[:19].replace("T", " ")
        if entry.get("type") == "directory":
            lines.append(f"{entry['path']}/\t\t{modified}")
        else:
            size = entry.get("size")
            lines.append(f"{entry['path']}\t{size if size is not None else ''}\t{modified}")
    if answer.get("truncated"):
        why = "the walk's time or entry budget ran out; " if answer.get("stopped") == "budget" else ""
        lines.append(f"({why}more: --start {shlex.quote(str(answer.get('next_start')))})")
    return "\n".join(lines) if lines else "(no entries)"


def select_cells(answer: dict[str, Any], value: str | None) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = list(answer.get("cells") or [])
    if value is None:
        return cells
    ref = parse_cell_ref(value)
    if ref.index is not None:
        found = [c for c in cells if c.get("index") == ref.index]
        if not found:
            total = answer.get("cell_count", len(cells))
            raise UsageError(f"Cell index {ref.index} is out of range (the notebook has {total} cells)")
        return found
    found = [c for c in cells if c.get("id") == ref.id]
    if not found:
        raise UsageError(f"Cell id '{ref.id}' not found in notebook")
    return found[:1]


def nb_show(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    if args.text:  # the route's format=text, naming this CLI's command for one output
        from ..notebook.reading import render_text  # lazy: the route's pure renderer, only for --text

        cell_ids = [_route_cell(args.cell)] if args.cell else None
        read = client.read_notebook(args.path, start=args.start, limit=args.limit, cell_ids=cell_ids)
        renderer.text([render_text(dict(read), output_call=output_command)])
        return exits.OK
    answer = dict(client.read_notebook(args.path, start=args.start, limit=args.limit))
    renderer.notebook(answer, select_cells(answer, args.cell), args.outputs, args.expand)
    return exits.OK


def output_command(path: str, cell: str | None, n: int | None, mime: str | None) -> str:
    """The command that prints one output in full (placeholders where ``cell`` and ``n`` are None)."""
    if cell is None or n is None:
        return f"jupyter agent nb output {shlex.quote(path)} --cell CELL N [--mime TYPE]"
    if cell.startswith("@"):
        cell = cell[1:]  # an index
    elif cell.isdigit():
        cell = f"id:{cell}"  # an id made of digits
    command = f"jupyter agent nb output {shlex.quote(path)} --cell {shlex.quote(cell)} {n}"
    return f"{command} --mime {shlex.quote(mime)}" if mime else command


def _route_cell(value: str) -> str:
    """A --cell value as the routes name a cell: its id, or @index."""
    ref = parse_cell_ref(value)
    return f"@{ref.index}" if ref.index is not None else str(ref.id)


def nb_output(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    cell = _route_cell(args.cell)
    if args.mime is None:
        answer = client.read_output(args.path, cell, args.n)
        data = (json.dumps(answer, indent=1, ensure_ascii=False) + "\n").encode()
    else:
        data = client.read_output_data(args.path, cell, args.n, args.mime)
    if args.save:
        try:
            Path(args.save).write_bytes(data)
        except OSError as e:
            raise UsageError(f"cannot write {args.save}: {e.strerror or e}") from None
        renderer.note(f"wrote {len(data)} bytes to {args.save}")
        return exits.OK
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{args.mime} is binary ({len(data)} bytes): give --save FILE") from None
    renderer.text([text if text.endswith("\n") else text + "\n"])
    return exits.OK


def nb_run(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    refs = [parse_cell_ref(value) for value in args.cells or []]
    ids = [r.id for r in refs if r.id is not None]
    indices = [r.index for r in refs if r.index is not None]
    if ids and indices:
        raise UsageError("name the cells to run all by index or all by id, not both")
    if args.detach:
        answer = client.detach_run_notebook(
            args.path,
            cell_ids=ids or None,
            cell_indices=indices or None,
            timeout=args.timeout,
            stop_on_error=args.stop_on_error,
            expected_hash=args.expected_hash,
        )
        return _started(renderer, answer)
    events = client.stream_run_notebook(
        args.path,
        cell_ids=ids or None,
        cell_indices=indices or None,
        timeout=args.timeout,
        stop_on_error=args.stop_on_error,
        expected_hash=args.expected_hash,
        include_images=True if args.save_images else None,  # the bytes to save
        raise_on_error=False,
    )
    save = Path(args.save_images) if args.save_images else None
    return _run(renderer, events, RunPlan(None, save))


def nb_ledger(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    """``nb log``, ``nb diff`` and ``nb undo``: the notebook's recorded changes."""
    if args.nb_command == "log":
        listing = client.notebook_changes(args.path, limit=args.limit, before=args.before)
        renderer.listing(changes_text(listing, args.path), listing)
    elif args.nb_command == "diff":
        entry = client.notebook_change(args.path, args.change_id)
        renderer.listing(change_text(entry), entry)
    else:
        answer = client.undo_change(
            args.path, args.change_id, expected_hash=args.expected_hash, approval_wait=0
        )
        if pending_approval(answer) is not None:
            return follow_approval(client, renderer, answer, args.approval_wait)
        renderer.done(f"{answer['message']} Hash: {answer['hash']}", answer)
    return exits.OK


def cmd_sessions(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    action = args.sessions_command or "list"
    if action == "list":
        renderer.sessions(client.sessions())
    elif action == "interrupt":
        answer = client.interrupt(args.name, args.owner)
        if answer.get("interrupted"):
            message = f"Interrupted session {args.name}: its running call was cancelled."
        else:
            message = f"Session {args.name} was running nothing; its kernel was sent an interrupt."
        renderer.done(message, answer)
    else:
        pending = client.delete_session(args.name, args.owner, approval_wait=0)  # awaited here, saying so
        if pending is not None:
            return follow_approval(client, renderer, pending, args.approval_wait)
        renderer.done(f"Shut down session {args.name}.", {"session": args.name, "deleted": True})
    return exits.OK


def runs_text(runs: list[dict[str, Any]]) -> str:
    """The detached runs as aligned columns, newest first."""
    if not runs:
        return "No detached runs.\n"
    columns = ("ID", "STATE", "KIND", "TARGET", "CELLS", "CREATED", "OWNER")
    rows = [list(columns)]
    for r in runs:
        rows.append(
            [
                str(r.get("run_id")),
                str(r.get("state")),
                str(r.get("kind")),
                str(r.get("target") or "-"),
                f"{r.get('cells_done', 0)}/{r.get('cells_started', 0)}",
                str(r.get("created") or ""),
                str(r.get("owner") or "-"),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in rows
    )


def run_text(run: dict[str, Any]) -> str:
    """One run: its state, its cells, and its output once it ended."""
    lines = [f"Run {run['run_id']}: {run['state']} ({run['kind']} {run.get('target') or ''})".rstrip()]
    if run.get("message"):
        lines.append(str(run["message"]))
    for cell in run.get("cells") or []:
        took = f" in {cell['duration_ms']} ms" if "duration_ms" in cell else ""
        lines.append(f"  cell {cell['index']}: {cell['status']}{took}")
    result = run.get("result")
    if result is not None:
        lines.append(artifact_commands(str(result.get("output") or "")))
    return "\n".join(lines) + "\n"


def cmd_runs(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    action = args.runs_command or "list"
    if action == "list":
        runs = client.runs()
        renderer.listing(runs_text(runs), {"runs": runs})
        return exits.OK
    if action == "cancel":
        answer = client.cancel_run(args.run_id)
        if answer["state"] in ("queued", "running"):
            message = f"Run {args.run_id}: cancel requested; its kernel is being interrupted."
        else:
            message = f"Run {args.run_id} had already ended ({answer['state']})."
        renderer.done(message, answer)
        return exits.OK
    if action == "show":
        run = client.run(args.run_id, wait=args.wait)
        renderer.listing(run_text(run), run)
        if run["state"] in ("queued", "running"):
            return exits.OK
        if run["state"] == "awaiting_approval":  # nothing ran yet: it runs once the person approves it
            return exits.PENDING
        return exits.for_result(run["result"]) if run.get("result") else exits.FAILED
    # watch: the events as a live run shows them, timed from the run's own start; leaving (Ctrl-C) stops
    # the watching, not the run
    run = client.run(args.run_id)
    save = Path(args.save_images) if args.save_images else None
    plan = RunPlan(
        None,
        save,
        where=run.get("target") if run.get("kind") == "notebook_run" else None,
        watching=True,
        started=epoch(run.get("started") or run.get("created")),
        ended=epoch(run.get("ended")),
        cells_started={
            int(cell["index"]): at
            for cell in run.get("cells") or []
            if (at := epoch(cell.get("started"))) is not None
        },
    )
    events = client.run_events(args.run_id, after=args.after, raise_on_error=False)
    try:
        return _run(renderer, events, plan)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        renderer.note(
            f"Stopped watching; run {args.run_id} goes on. Follow it again: jupyter agent runs watch "
            f"{args.run_id}   Stop it: jupyter agent runs cancel {args.run_id}"
        )
        return exits.CANCELLED


def epoch(iso: Any) -> float | None:
    """Seconds since the epoch of an ISO 8601 UTC time the API gives (``2026-12-04T10:00:00.123Z``)."""
    if not isinstance(iso, str) or not iso:
        return None
    try:
        return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str, option: str) -> float:
    """Seconds of a duration like ``90s``, ``30m``, ``8h``, ``7d``, ``2w`` (a bare number: seconds), given
    as ``option`` (named in the error)."""
    match = DURATION.match(text)
    if not match:
        raise UsageError(f"{option} wants a number and a unit (s, m, h, d, w), e.g. 8h; got {text!r}")
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


def _comma_list(values: list[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def tokens_text(tokens: list[dict[str, Any]]) -> str:
    """The agent tokens as aligned columns."""
    if not tokens:
        return "No agent tokens.\n"
    columns = ("NAME", "STATUS", "SCOPES", "PATHS", "ASKS FOR", "EXPIRES", "LAST USED")
    rows = [list(columns)]
    for t in tokens:
        rows.append(
            [
                str(t.get("name")),
                str(t.get("status")),
                ",".join(t.get("scopes") or []),
                ",".join(t.get("paths") or []) or "*",
                ",".join(t.get("ask") or []) or "-",
                str(t.get("expires") or "never"),
                str(t.get("last_used") or "never"),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    return "".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n" for row in rows
    )


def cmd_token(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    if args.token_command == "list":
        tokens = client.tokens()
        renderer.listing(tokens_text(tokens), {"tokens": tokens})
    elif args.token_command == "create":
        expires_in = parse_duration(args.expires, "--expires") if args.expires else None
        if expires_in is not None and not TOKEN_MIN_EXPIRES_IN <= expires_in <= TOKEN_MAX_EXPIRES_IN:
            raise UsageError(
                f"--expires must be at least 1m and at most 366d (a token lives 1 minute to 366 days); "
                f"got {args.expires}"
            )
        answer = client.create_token(
            args.name,
            _comma_list([args.scopes]),
            paths=_comma_list(args.paths) or None,
            expires_in=expires_in,
            ask=_comma_list(args.ask) or None,
        )
        until = f"until {answer['expires']}" if answer.get("expires") else "until revoked"
        renderer.done(
            f"{answer['token']}\n"
            f"Agent token {answer['name']!r} (user {answer['user']}, scopes {','.join(answer['scopes'])}, "
            f"paths {', '.join(answer.get('paths') or []) or 'all files'}"
            + (f", asks the person before: {','.join(answer['ask'])}" if answer.get("ask") else "")
            + f"), valid {until}. It is shown this once: give it to the agent as JUPYTER_AGENT_TOKEN.",
            answer,
        )
        for warning in answer.get("warnings") or ():
            renderer.note(f"Warning: {warning}")
    else:
        answer = client.revoke_token(args.name)
        renderer.done(f"Revoked agent token {args.name!r}: it is refused from now on.", answer)
    return exits.OK


def _tail(pieces: Iterator[str], count: int) -> Iterator[str]:
    """The last ``count`` lines of a text that arrives in pieces, holding only those lines."""
    lines: collections.deque[str] = collections.deque(maxlen=count + 1)
    partial = ""
    for piece in pieces:
        parts = (partial + piece).split("\n")
        partial = parts.pop()
        lines.extend(line + "\n" for line in parts)
    if partial:
        lines.append(partial)
    kept = list(lines)[-count:] if count > 0 else []
    yield "".join(kept)


# What an agent's text may carry that a terminal would act on, or show as something else: C0 controls but
# \t and \n, DEL, C1, lone surrogates; bidirectional controls (Trojan Source: U+202A-U+202E, U+2066-U+2069,
# the marks U+200E, U+200F, U+061C) and invisible characters (U+200B-U+200D, U+2060, U+FEFF).
_UNSHOWN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200b-\u200f\u202a-\u202e\u2060\u2066-\u2069\ufeff]"
)
_NAMED = {"\r": "\\r", "\x1b": "\\x1b"}


def visible(text: str) -> str:
    """``text`` with every control and invisible character written as an escape (``\\r``, ``\\x1b``,
    ``\\u202e``): an agent's code cannot move the cursor, hide a line or reorder what the person reads."""
    return _UNSHOWN.sub(lambda m: _NAMED.get(m[0]) or f"\\u{ord(m[0]):04x}", text)


def approvals_text(listing: dict[str, Any]) -> str:
    """The requests waiting for the person, then the recent decisions, a line each."""
    lines = []
    for a in listing.get("pending") or []:
        lines.append(
            f"{a['id']:>5}  pending    {a['agent']}  {a['action']}  {a['summary']}  (expires {a['expires']})"
        )
    for a in listing.get("recent") or []:
        by = f" by {a['decided_by']}" if a.get("decided_by") else ""
        lines.append(f"{a['id']:>5}  {a['state']:<9}  {a['agent']}  {a['action']}  {a['summary']}{by}")
    return visible("\n".join(lines)) + "\n" if lines else "No approval requests.\n"


def _shown_cell(cell: dict[str, Any]) -> str | None:
    """A cell of a request: an edit's diff, or the code or source it runs."""
    name = cell.get("id") or f"@{cell.get('index')}"
    if cell.get("diff"):
        return f"--- cell {name}: {', '.join(cell.get('what') or [])}\n{cell['diff'].rstrip()}"
    code = cell.get("code") if cell.get("code") is not None else cell.get("source")
    return f"--- cell {name}:\n{str(code).rstrip()}" if code is not None else None


def approval_text(a: dict[str, Any]) -> str:
    """One request in full: who asks to do what, and exactly what would happen (control and invisible
    characters shown as escapes; a request cut to ApprovalPolicy.max_detail_bytes says so first)."""
    details = a.get("details") or {}
    actions = " and ".join(map(str, details.get("actions") or [a["action"]]))
    head = [
        f"Approval {a['id']}: {a['agent']} asks to {a['summary']} ({actions}, via {a['door']})",
        f"state: {a['state']}"
        + (f" by {a['decided_by']}" if a.get("decided_by") else "")
        + (f": {a['reason']}" if a.get("reason") else ""),
    ]
    if a.get("truncated"):
        head.append(
            f"WARNING: {a['truncated']} bytes of what it would do are not shown (cut to the server's "
            "ApprovalPolicy.max_detail_bytes): approve only if the part shown is enough."
        )
    found = details.get("cells")
    cells: list[Any] = [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []
    if any("code" in c for c in cells):  # an eval: where and how it runs
        settings = [f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in details.items() if k != "cells"]
        if settings:
            head.append("--- runs with " + ", ".join(settings))
    edit = details.get("edit") or {}
    if edit.get("cells"):  # a run's ops: their diff, then the cells the run runs
        head.append(f"edits: {edit.get('summary')}")
        head.extend(filter(None, map(_shown_cell, edit["cells"])))
        head.append("then runs:")
    head.extend(filter(None, map(_shown_cell, cells)))
    if a.get("outcome"):
        head.append(f"outcome: {a['outcome'].get('message')} (HTTP {a['outcome'].get('status')})")
    return visible("\n".join(head)) + "\n"


def cmd_approvals(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    action = args.approvals_command or "list"
    if action == "list":
        listing = client.approvals()
        renderer.listing(approvals_text(listing), listing)
        return exits.OK
    if action == "show":
        answer = client.approval(args.approval_id)
        renderer.listing(approval_text(answer), answer)
        return exits.OK
    for_seconds = parse_duration(args.for_, "--for") if action == "approve" and args.for_ else None
    reason = args.reason if action == "deny" else None
    answer = client.decide_approval(
        args.approval_id, "approve" if action == "approve" else "deny", for_seconds=for_seconds, reason=reason
    )
    grant = f" (and the same for {args.for_})" if for_seconds else ""
    renderer.done(f"Approval {answer['id']} {answer['state']}{grant}: {answer['summary']}.", answer)
    return exits.OK


def cmd_artifact(client: AgentClient, args: argparse.Namespace, renderer: Renderer) -> int:
    pieces = client.stream_artifact(args.artifact_id)
    with contextlib.closing(pieces):
        renderer.text(_tail(pieces, args.tail) if args.tail is not None else pieces)
    return exits.OK


COMMANDS: dict[str, Command] = {
    "eval": cmd_eval,
    "nb": cmd_nb,
    "sessions": cmd_sessions,
    "artifact": cmd_artifact,
    "token": cmd_token,
    "approvals": cmd_approvals,
    "files": cmd_files,
    "runs": cmd_runs,
}


def describe_error(error: AgentAPIError) -> str:
    """One line that says what failed and what to do."""
    if error.status is None:
        if error.reason == "unreachable":
            return f"{error.message} (is it running? set --url or JUPYTER_AGENT_URL to another server)"
        return error.message
    if error.reason == "approval_denied":
        return f"denied: {error.message}"
    if exits.refused_scope(error):
        if error.reason == REFUSED_MISSING_SCOPE:
            return (
                f"the agent token lacks the scope this needs (HTTP 403): {error.message} Ask the server's "
                "owner for a token with that scope (jupyter agent token create NAME --scopes ...)"
            )
        return f"agent tokens cannot do this (HTTP 403): {error.message}"
    if error.status in (401, 403):
        return (
            f"the server refused the request (HTTP {error.status}): {error.message}; "
            "check the token (--token, JUPYTER_AGENT_TOKEN)"
        )
    return f"{error.message} (HTTP {error.status})"


def main(argv: list[str] | None = None) -> int:
    """``jupyter agent``: parse, find the server, run the command; returns the exit code."""
    args = parse(argv)
    if args.command == "mcp":  # stdout is the protocol's: no renderer, errors go to the MCP client
        from .mcp_stdio import main as relay

        return relay(args.url, args.token)
    renderer = choose(args.json, args.ndjson, args.plain)
    try:
        server = find_server(args.url, args.token, note=renderer.note)
    except ServerNotFound as e:
        renderer.error(str(e))
        return exits.UNREACHABLE
    try:
        with AgentClient(server.url, server.token, client="cli") as client:
            try:
                return COMMANDS[args.command](client, args, renderer)
            except AgentAPIError as e:
                renderer.error(describe_error(e))
                return approval_exit(client, e)
    except UsageError as e:
        renderer.error(str(e))
        return exits.USAGE
    except AgentAPIError as e:
        renderer.error(describe_error(e))
        return exits.for_error(e)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave a traceback
        renderer.error("cancelled: the run was interrupted (Ctrl-C)")
        return exits.CANCELLED
