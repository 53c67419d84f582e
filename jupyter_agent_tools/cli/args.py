"""The command line of ``jupyter agent``: subcommands and their options (argparse)."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence

PROG = "jupyter agent"
EPILOG = """\
The server: --url/--token, else JUPYTER_AGENT_URL and JUPYTER_AGENT_TOKEN (or JUPYTER_TOKEN, or
JUPYTERHUB_API_TOKEN for a JupyterHub server such as --url http://hub:8000/user/alice/), else the running
Jupyter server whose root directory holds the current directory (`jupyter server list`).

On a terminal the output is rendered (live cell status, colours); otherwise it is plain text, exactly
what the API answers (an eval's `output`, its `artifact://ID` notices written as `jupyter agent artifact
ID`; a notebook change's message and the cell's source).

Exit codes: 0 all cells complete, 1 a cell failed, 2 bad usage or a 4xx answer, 3 server unreachable or
auth refused, 4 the agent token lacks the scope, 6 denied (by the person or a rule), 7 the approval
request expired or was withdrawn, 8 still waiting for approval when the command stopped waiting (done
once approved), 124 timed out, 130 cancelled (Ctrl-C interrupts the kernel)."""

PATH_HELP = "the notebook, relative to the server root"
CELL_HELP = "a cell index (0-based), a cell id, or id:ID for an id made of digits"


def _common(parser: argparse.ArgumentParser, *, stream: bool = False) -> None:
    # SUPPRESS: an option given before the subcommand is not reset by the subcommand's parser.
    group = parser.add_argument_group("server and output")
    group.add_argument("--url", default=argparse.SUPPRESS, help="the server's URL (with its base_url)")
    group.add_argument("--token", default=argparse.SUPPRESS, help="the server's token")
    group.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the JSON answer")
    if stream:
        group.add_argument(
            "--ndjson",
            action="store_true",
            default=argparse.SUPPRESS,
            help="print the event stream as it comes",
        )
    group.add_argument(
        "--plain", action="store_true", default=argparse.SUPPRESS, help="plain text even on a terminal"
    )


def _content(parser: argparse.ArgumentParser, required: bool) -> None:
    source = parser.add_mutually_exclusive_group(required=False)
    source.add_argument("--content", help="the cell's new source")
    source.add_argument("--file", metavar="F", help="read the source from file F")
    parser.add_argument("stdin", nargs="?", choices=["-"], metavar="-", help="read the source from stdin")
    parser.set_defaults(content_required=required)


def _typed_cell(kind: str, source: str) -> tuple[str, str]:
    return kind, source


def _cell_type(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--type", dest="cell_type", choices=["code", "markdown", "raw"], help="the cell type")


def _expected_hash(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--expected-hash", metavar="HASH", help="refuse (409) if the notebook changed since this hash"
    )


def _approval_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--approval-wait",
        type=float,
        metavar="SECONDS",
        help="when the person must approve it: how long to wait for their decision (default: until they "
        "decide or the request expires); still undecided, exit 8 (it is done once approved)",
    )


def _edit_options(parser: argparse.ArgumentParser, expand: str = "do not collapse a long source") -> None:
    """The options every ``nb`` edit shares: the expected hash, fidelity, ``--expand``, the approval wait
    and the common ones."""
    _expected_hash(parser)
    _fidelity(parser)
    parser.add_argument("--expand", action="store_true", help=expand)
    _approval_wait(parser)
    _common(parser)


def _fidelity(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--upgrade", action="store_true", help="an nbformat 3 file: write it converted to nbformat 4.5"
    )
    parser.add_argument(
        "--repair", action="store_true", help="a notebook invalid as found: apply nbformat's repairs first"
    )


def _run_display(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--save-images", metavar="DIR", help="save image displays to files in DIR")


def _detach(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--detach",
        action="store_true",
        help="start it and return at once with its run id; it goes on without this command "
        "(jupyter agent runs watch ID)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run code and edit notebooks on a Jupyter server with jupyter-agent-tools.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", help="the server's URL (with its base_url)")
    parser.add_argument("--token", help="the server's token")
    parser.add_argument("--json", action="store_true", help="print the JSON answer")
    parser.add_argument("--ndjson", action="store_true", help="eval / nb run: print the event stream")
    parser.add_argument("--plain", action="store_true", help="plain text even on a terminal")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    ev = commands.add_parser(
        "eval",
        help="run Python cells in a session's kernel",
        description="Run Python cells: each -c is one cell; a file is split into cells at `# %%` lines "
        "(the rest of the line is the cell's title); - reads stdin.",
    )
    ev.add_argument("-c", "--code", action="append", default=[], metavar="CODE", help="one cell of code")
    ev.add_argument("files", nargs="*", metavar="FILE", help="files to run (- for stdin)")
    ev.add_argument("-s", "--session", help="the session (default: 'default'; names are your own)")
    ev.add_argument("--per-call", action="store_true", help="a fresh kernel for this call only")
    ev.add_argument("--reset", action="store_true", help="give the session a fresh kernel first")
    ev.add_argument(
        "--timeout",
        type=float,
        metavar="N",
        help="seconds for the whole call (server default 30; with --detach none)",
    )
    ev.add_argument(
        "--cwd", metavar="DIR", help="the kernel's working directory, relative to the server root"
    )
    ev.add_argument(
        "-e", "--env", action="append", default=[], metavar="KEY=VAL", help="an environment variable"
    )
    ev.add_argument("--kernel", metavar="NAME", help="the kernel spec (default: the server's)")
    _detach(ev)
    ev.add_argument(
        "--notebook",
        metavar="PATH",
        help="run in this notebook's own kernel (its variables; file not written)",
    )
    _run_display(ev)
    _common(ev, stream=True)

    nb = commands.add_parser("nb", help="read, change and run a notebook", description="Notebook commands.")
    nbc = nb.add_subparsers(dest="nb_command", metavar="ACTION")
    nbc.required = True

    show = nbc.add_parser("show", help="show a notebook's cells (and hash)")
    show.add_argument("path", metavar="PATH", help=PATH_HELP)
    show.add_argument("--cell", help=CELL_HELP)
    show.add_argument("--outputs", action="store_true", help="show the cells' outputs too")
    show.add_argument("--expand", action="store_true", help="do not collapse long cells")
    show.add_argument("--start", type=int, metavar="N", help="a page: the first cell (0-based)")
    show.add_argument("--limit", type=int, metavar="N", help="a page: at most N cells")
    show.add_argument(
        "--text", action="store_true", help="print the server's compact text for a model (format=text)"
    )
    _common(show)

    output = nbc.add_parser("output", help="print one output of a cell in full, or save one MIME type of it")
    output.add_argument("path", metavar="PATH", help=PATH_HELP)
    output.add_argument("--cell", required=True, help=CELL_HELP)
    output.add_argument("n", type=int, metavar="N", help="the output's index in the cell (0-based)")
    output.add_argument("--mime", metavar="TYPE", help="one MIME type of it (e.g. text/plain, image/png)")
    output.add_argument("--save", metavar="FILE", help="write the data to FILE (needed for binary types)")
    _common(output)

    edit = nbc.add_parser("edit", help="replace a cell's source")
    edit.add_argument("path", metavar="PATH", help=PATH_HELP)
    edit.add_argument("--cell", required=True, help=CELL_HELP)
    _content(edit, required=True)
    _cell_type(edit)
    edit.add_argument(
        "--run", action="store_true", help="then run the cell, in one call (one save, one ledger entry)"
    )
    _edit_options(edit)

    insert = nbc.add_parser("insert", help="insert a new cell")
    insert.add_argument("path", metavar="PATH", help=PATH_HELP)
    insert.add_argument(
        "--at", "--cell", dest="at", type=int, metavar="INDEX", help="where the cell goes (default: the end)"
    )
    insert.add_argument("--id", dest="new_id", metavar="ID", help="the new cell's id (default: derived)")
    _content(insert, required=True)
    _cell_type(insert)
    insert.add_argument(
        "--run", action="store_true", help="then run the cell, in one call (one save, one ledger entry)"
    )
    _edit_options(insert)

    delete = nbc.add_parser("delete", help="delete a cell")
    delete.add_argument("path", metavar="PATH", help=PATH_HELP)
    delete.add_argument("--cell", required=True, help=CELL_HELP)
    _edit_options(delete, expand="do not collapse the removed source")

    move = nbc.add_parser("move", help="move a cell")
    move.add_argument("path", metavar="PATH", help=PATH_HELP)
    move.add_argument("--cell", required=True, help=CELL_HELP)
    move.add_argument("--to", dest="to_index", type=int, required=True, metavar="INDEX", help="its new index")
    _edit_options(move)

    clear = nbc.add_parser("clear", help="clear the outputs of a cell or of all cells")
    clear.add_argument("path", metavar="PATH", help=PATH_HELP)
    which = clear.add_mutually_exclusive_group(required=True)
    which.add_argument("--cell", help=CELL_HELP)
    which.add_argument("--all", action="store_true", help="every cell")
    _edit_options(clear)

    replace = nbc.add_parser("replace", help="replace exact text inside a cell (once, or every match)")
    replace.add_argument("path", metavar="PATH", help=PATH_HELP)
    replace.add_argument("--cell", required=True, help=CELL_HELP)
    for name, what in (("old", "the exact text to find"), ("new", "what replaces it")):
        group = replace.add_mutually_exclusive_group(required=True)
        group.add_argument(f"--{name}", metavar="TEXT", help=what)
        group.add_argument(
            f"--{name}-file", metavar="FILE", help=f"{what}, read from FILE (- for stdin, for one of the two)"
        )
    replace.add_argument("--all", action="store_true", help="replace every match (default: exactly one)")
    _edit_options(replace)

    new = nbc.add_parser("create", help="create a notebook (refused if the path exists)")
    new.add_argument("path", metavar="PATH", help=PATH_HELP)
    for kind, what in (("code", "a code cell"), ("markdown", "a markdown cell (cells keep their order)")):
        new.add_argument(
            f"--{kind}",
            dest="new_cells",
            action="append",
            type=functools.partial(_typed_cell, kind),
            metavar="SRC",
            help=what,
        )
    new.add_argument("--kernel", metavar="NAME", help="the kernelspec (default: the server's default)")
    new.add_argument("--parents", action="store_true", help="create missing folders")
    new.add_argument("--expand", action="store_true", help="do not collapse long cells")
    _common(new)

    run = nbc.add_parser("run", help="run a notebook's cells (all by default)")
    run.add_argument("path", metavar="PATH", help=PATH_HELP)
    chosen = run.add_mutually_exclusive_group()
    chosen.add_argument("--cell", action="append", dest="cells", metavar="CELL", help=f"{CELL_HELP}; repeat")
    chosen.add_argument("--all", action="store_true", help="every code cell (the default)")
    run.add_argument("--timeout", type=float, metavar="N", help="seconds for the whole run")
    run.add_argument(
        "--stop-on-error",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stop at the first failing cell (server default)",
    )
    _expected_hash(run)
    _detach(run)
    _run_display(run)
    _common(run, stream=True)

    log = nbc.add_parser("log", help="the changes made to a notebook through the server, newest first")
    log.add_argument("path", metavar="PATH", help=PATH_HELP)
    log.add_argument("--limit", type=int, metavar="N", help="at most N changes (default 50)")
    log.add_argument("--before", metavar="ID", help="only changes older than change ID")
    _common(log)

    diff = nbc.add_parser("diff", help="one change: each cell's what and source diff")
    diff.add_argument("path", metavar="PATH", help=PATH_HELP)
    diff.add_argument("change_id", metavar="ID", help="the change (nb log lists them)")
    _common(diff)

    kernel = nbc.add_parser("kernel", help="the notebook's own kernel: state; interrupt, restart, shutdown")
    kernel.add_argument("path", metavar="PATH", help=PATH_HELP)
    kernel.add_argument("action", nargs="?", choices=["interrupt", "restart", "shutdown"], help="what to do")
    _approval_wait(kernel)
    _common(kernel)

    undo = nbc.add_parser("undo", help="undo one change (refused if a cell it touched changed since)")
    undo.add_argument("path", metavar="PATH", help=PATH_HELP)
    undo.add_argument("change_id", metavar="ID", help="the change (nb log lists them)")
    _expected_hash(undo)
    _approval_wait(undo)
    _common(undo)

    sessions = commands.add_parser("sessions", help="list, interrupt or shut down eval sessions")
    sc = sessions.add_subparsers(dest="sessions_command", metavar="ACTION")
    listing = sc.add_parser("list", help="list the sessions (the default)")
    _common(listing)
    interrupt = sc.add_parser("interrupt", help="cancel what a session is running")
    remove = sc.add_parser("rm", help="shut a session's kernel down")
    for action in (interrupt, remove):
        action.add_argument("name", metavar="NAME")
        action.add_argument("--owner", help="whose session of that name, as listed (default: your own)")
    _approval_wait(remove)
    for action in (interrupt, remove):
        _common(action)
    _common(sessions)

    runs = commands.add_parser(
        "runs",
        help="detached runs (--detach): list, show, watch or cancel them",
        description="Detached runs: evals and notebook runs started with --detach go on without their "
        "client. Without an action: the list.",
    )
    rc = runs.add_subparsers(dest="runs_command", metavar="ACTION")
    runs_list = rc.add_parser("list", help="list the runs you may see (the default)")
    _common(runs_list)
    runs_show = rc.add_parser("show", help="a run's state, cells and (once ended) its output")
    runs_show.add_argument("run_id", metavar="ID")
    runs_show.add_argument("--wait", type=float, metavar="S", help="wait up to S seconds for it to end first")
    _common(runs_show)
    watch = rc.add_parser("watch", help="show a run's events as a live run shows them, until it ends")
    watch.add_argument("run_id", metavar="ID")
    watch.add_argument("--after", type=int, default=0, metavar="SEQ", help="only events after SEQ")
    _run_display(watch)
    _common(watch, stream=True)
    runs_cancel = rc.add_parser("cancel", help="stop a run (its kernel is interrupted)")
    runs_cancel.add_argument("run_id", metavar="ID")
    _common(runs_cancel)
    _common(runs)

    token = commands.add_parser(
        "token",
        help="create, list or revoke agent tokens (needs the server's own token)",
        description="Agent tokens: scoped, revocable identities for agents (the server must enable them: "
        "docs/admin.md). Managing them needs the server's own token, never an agent token.",
    )
    tc = token.add_subparsers(dest="token_command", metavar="ACTION")
    tc.required = True
    create = tc.add_parser("create", help="create a token and print it (shown once)")
    create.add_argument("name", metavar="NAME", help="the agent's name: it acts as the user agent:NAME")
    create.add_argument(
        "--scopes", required=True, metavar="S", help="comma-separated: read, edit (read + writes), execute"
    )
    create.add_argument(
        "--paths",
        action="append",
        default=[],
        metavar="GLOB",
        help="only files matching GLOB, e.g. 'reports/**' (repeat, or separate with commas)",
    )
    create.add_argument("--expires", metavar="DURATION", help="lifetime, e.g. 30m, 8h, 7d (default: never)")
    create.add_argument(
        "--ask",
        action="append",
        default=[],
        metavar="ACTIONS",
        help="what the agent must ask the person for first, e.g. execute,edit (of read, edit, execute, "
        "kernel: docs/approvals.md)",
    )
    _common(create)
    listing_tokens = tc.add_parser("list", help="list the tokens (never the tokens themselves)")
    _common(listing_tokens)
    revoke = tc.add_parser("revoke", help="revoke a token: it is refused from now on")
    revoke.add_argument("name", metavar="NAME")
    _common(revoke)
    _common(token)

    approvals = commands.add_parser(
        "approvals",
        help="list, show, approve or deny what agents ask the person (the approval gate)",
        description="The approval gate (docs/approvals.md): the requests agents are waiting on, and the "
        "person's decision. Deciding needs a person's credentials (the server's own token), never an agent "
        "token.",
    )
    ac = approvals.add_subparsers(dest="approvals_command", metavar="ACTION")
    _common(ac.add_parser("list", help="the requests waiting, then the recent decisions (the default)"))
    show = ac.add_parser("show", help="one request, with the code or diff it would run or write")
    show.add_argument("approval_id", type=int, metavar="ID")
    _common(show)
    approve = ac.add_parser("approve", help="approve a request: the waiting agent goes on at once")
    approve.add_argument("approval_id", type=int, metavar="ID")
    approve.add_argument(
        "--for",
        dest="for_",
        metavar="DURATION",
        help="also approve this agent's same action on the same notebook for that long, e.g. 10m",
    )
    _common(approve)
    deny = ac.add_parser("deny", help="deny a request: the agent is told, with the reason")
    deny.add_argument("approval_id", type=int, metavar="ID")
    deny.add_argument("--reason", help="why (the agent is told)")
    _common(deny)
    _common(approvals)

    files = commands.add_parser("files", help="find notebooks and files (glob, depth, pages)")
    files.add_argument("path", nargs="?", default="", metavar="DIR", help="the folder (default: the root)")
    files.add_argument("--glob", metavar="GLOB", help="only paths matching it, e.g. '**/*.ipynb'")
    files.add_argument("--max-depth", type=int, metavar="N", help="levels walked (1: DIR's own entries)")
    files.add_argument("-r", "--recursive", action="store_true", help="walk every level")
    files.add_argument("--start", metavar="PATH", help="a page: after this path (the last page's next_start)")
    files.add_argument("--limit", type=int, metavar="N", help="a page: at most N entries (default 500)")
    files.add_argument(
        "--ignored", action="store_true", help="also what .gitignore and .ignore exclude (node_modules...)"
    )
    _common(files)

    mcp = commands.add_parser(
        "mcp",
        help="an MCP server on stdio that relays to the server's MCP endpoint (for stdio-only clients)",
        description="Speak MCP on stdin/stdout (newline-delimited JSON-RPC) and relay every message to the "
        "server's /api/agent/mcp with its token: for MCP clients that only start local commands (Claude "
        "Desktop). stdout carries protocol messages only; notes and errors go to stderr. Ends when stdin "
        "ends (once the calls in flight are answered) or on SIGTERM (they are cancelled).",
    )
    mcp.add_argument("--url", default=argparse.SUPPRESS, help="the server's URL (with its base_url)")
    mcp.add_argument("--token", default=argparse.SUPPRESS, help="the server's token")

    artifact = commands.add_parser("artifact", help="print the full output of a truncated cell")
    artifact.add_argument("artifact_id", metavar="ID")
    artifact.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    _common(artifact)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; usage errors exit with code 2 (argparse's own)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra == ["-"] and getattr(args, "stdin", "") is None:
        # argparse gives an optional positional its (empty) value at the path already, so a "-" after
        # options would be refused as unrecognized
        args.stdin = "-"
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        parser.exit(2)
    if args.json and args.ndjson:
        parser.error("--json and --ndjson exclude each other")
    return args
