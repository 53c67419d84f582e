"""Reads notebooks and applies cell operations: to the file, or to the live document of an open room.

The contents manager confines paths to the server root, keeps checkpoints and may not be a local disk at
all. On a local disk (see :func:`~jupyter_agent_tools.compat.local_os_path`) the store reads the file's
bytes itself and writes atomically (:mod:`.disk`): jupyter_server's own save writes in place, which a
reader or a crash can catch half done. Edits of one notebook are serialized by a per-path lock so that
concurrent requests never lose each other's changes, and the file is checked again just before it is
replaced, so that a change by another writer (JupyterLab, git, an editor) is never silently overwritten.

When the notebook is open in a collaborative room (see :mod:`.live`), reads and edits go to the room's
live document instead of the file, through the same pipeline: read -> check ``expected_hash`` ->
:func:`apply_ops` -> validate -> write back (one Y transaction instead of one save).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import posixpath
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from jupyter_core.utils import ensure_async
from nbformat.validator import ValidationError, get_validator
from traitlets import Any as AnyTrait
from traitlets import Float, Instance, Int, default, validate

from ..audit import NO_AUDIT, Audit
from ..auth.context import path_allowed
from ..compat import ServerHTTPError, local_os_path
from ..errors import AgentToolsError, BadRequest, Conflict, NotFound, Unavailable
from ..ledger.changes import diff as change_of
from ..ledger.changes import summarize
from ..ledger.service import ChangeGroup, Ledger, Recorded, cell_bodies, check_hash
from ..ledger.undo import check_undo, inverse
from ..service import Service, at_least
from ..validation import check
from . import disk
from .create import new_notebook as build_notebook
from .create import parse_create_request
from .format import cells_hash, content_hash, parse_any_notebook, serialize_notebook
from .layout import follow_source_style, render_edit
from .live import LiveDocuments, LiveNotebook
from .operations import EditOutcome, apply_ops, check_supported, parse_edit_request
from .reading import ReadView, read_notebook, read_output
from .validity import duplicate_ids, indexes, notebook_problems, repair_notebook

T = TypeVar("T")
V = TypeVar("V")
# notebook, its hash -> the changed notebook (a new dict; the given one is not mutated) and a result
Transform = Callable[[dict[str, Any], str], tuple[dict[str, Any], T]]

# How often a read looks again at a file that another writer is in the middle of saving.
BUSY_POLL_SECONDS = 0.02
# Retry-After of a 503 for a file being saved: jupyter_server's saves take well under a second.
BUSY_RETRY_AFTER = 1
# An edit without expected_hash is applied again to a file another writer changed between our read and our
# write; a writer that changes it faster than we can edit it gets a 409 after this many attempts.
EDIT_ATTEMPTS = 5
# Notebooks of more characters than this are parsed (older than nbformat 4: converted) and summarized
# in a thread (about 10 ms of work on the loop).
OFF_LOOP_CHARS = 1024 * 1024
# How many texts in nbformat's layout the store remembers having written (see NotebookStore.change).
NBFORMAT_LAYOUT_MEMORY = 256
# How many texts' validation results (``problems`` of a read) the store keeps.
PROBLEMS_MEMORY = 64
# Longest path shown in an error message (a refused path can be megabytes long).
SHOWN_PATH_CHARS = 200


@dataclass
class LoadedNotebook:
    """A notebook as read from the store: its parsed dict, its text and the hash of its bytes.

    ``os_path`` is the file behind it on a local disk (None when the contents manager is not one).
    ``converted_from`` is the nbformat version of a file older than nbformat 4 ("3.0"), which
    ``notebook`` shows converted to 4.5.
    """

    path: str
    notebook: dict[str, Any]
    text: str
    hash: str
    os_path: str | None = None
    converted_from: str | None = None


def validate_notebook(nb: dict[str, Any], path: str, before: dict[str, Any] | None = None) -> None:
    """Raise :class:`BadRequest` unless ``nb`` is valid against its nbformat schema, with unique cell ids.

    ``before`` is the notebook as it was found: when it was already invalid, the message names its
    problems (which cell, which key) and says how to repair it, instead of blaming the edit.
    """
    minor = nb.get("nbformat_minor")
    validator = get_validator(version=4, version_minor=minor if isinstance(minor, int) else None)
    if validator is None:
        raise BadRequest(f"Unsupported notebook format in {path}: nbformat 4.{minor}")
    try:
        validator.validate(nb)
    except ValidationError as e:  # fastjsonschema and jsonschema raise different ValidationErrors
        message = getattr(e, "message", None) or str(e)
    else:
        duplicates = duplicate_ids(nb)
        if not duplicates:
            return
        cell_id, where = next(iter(duplicates.items()))
        message = f"cells {indexes(where)} would share the id {cell_id!r}"
    problems = notebook_problems(before) if before is not None else []
    if problems:
        raise BadRequest(invalid_as_found(path, problems))
    raise BadRequest(f"Notebook would not be a valid nbformat 4.{minor} notebook: {path}: {message}")


def invalid_as_found(path: str, problems: list[str]) -> str:
    """The message for a write refused because the notebook was invalid before it."""
    return (
        f"Notebook {path} was already invalid before this change (nothing was changed): "
        f'{"; ".join(problems)}. Send the edit with "repair": true to apply nbformat\'s repairs first '
        "(the answer lists each repair)"
    )


def needs_upgrade(path: str, version: str) -> str:
    """The message for a write of a notebook older than nbformat 4 without ``upgrade``."""
    return (
        f"Notebook {path} is an nbformat {version} file: reads show it converted to nbformat 4.5, and "
        "writing it means rewriting the whole file as nbformat 4.5 (nothing was changed). Send the edit "
        'again with "upgrade": true to do that'
    )


def shown(path: str) -> str:
    """``path`` as error messages show it: cut when it is very long."""
    if len(path) <= SHOWN_PATH_CHARS:
        return path
    return f"{path[:SHOWN_PATH_CHARS]}... ({len(path)} characters)"


@contextmanager
def path_errors(path: str) -> Iterator[None]:
    """Turn a file system error caused by the path a caller sent into the 4xx that says what to fix."""
    try:
        yield
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise BadRequest(
                f"Notebook path is too long for the file system: {shown(path)} ({len(path.encode())} "
                "bytes); use a shorter path (file systems allow about 4096 bytes in a path, 255 in a name)"
            ) from e
        if e.errno == errno.ELOOP:
            raise BadRequest(f"Too many levels of symbolic links in the notebook path: {shown(path)}") from e
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            raise NotFound(f"Notebook not found: {shown(path)}") from e
        if e.errno in (errno.EACCES, errno.EPERM):
            raise AgentToolsError(f"Permission denied: {shown(path)}", 403) from e
        raise


def edit_diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What an edit changes, as the approval gate shows it: a summary, and each cell it touches with its
    fields before and after and its source diff (an edit's request, and a run's ``ops``)."""
    change = change_of(before, after)
    return {"summary": summarize(change), "cells": [{**c.summary(), **cell_bodies(c)} for c in change.cells]}


class NotebookStore(Service):
    """Reads and edits notebooks through a jupyter_server contents manager.

    The application builds the class named by ``AgentToolsApp.notebook_store_class`` with
    ``parent=app`` and its collaborators; the settings are ``c.NotebookStore.*``.
    """

    contents_manager = AnyTrait(help="The server's contents manager (reads and saves the files).")
    live = Instance(LiveDocuments, allow_none=True, help="Where notebooks open in RTC rooms are edited.")
    summary_max_chars = Int(
        2000,
        help="Characters of each text output (stream, result, traceback) shown when an agent reads a "
        "notebook; longer text is cut with a note. 0 means no limit.",
    ).tag(config=True)
    max_ops = Int(1000, help="Most cell operations accepted in one batch edit request.").tag(config=True)
    busy_timeout = Float(
        3.0,
        help="Seconds a notebook read or edit waits for a file that another writer (JupyterLab saving "
        "through /api/contents, an editor) is in the middle of writing; past it the request answers 503 "
        "with Retry-After. Reads never treat such a file as corrupt.",
    ).tag(config=True)
    audit = Instance(Audit, help="Records every change (audit event and metrics).")
    ledger = Instance(Ledger, allow_none=True, help="Records every change for review and undo (None: off).")
    kernel_spec_manager = AnyTrait(
        None, allow_none=True, help="The server's kernelspec manager: a new notebook's kernelspec."
    )

    @default("audit")
    def _default_audit(self) -> Audit:
        return NO_AUDIT

    @validate("max_ops")
    def _valid_max_ops(self, proposal: Any) -> int:
        return int(at_least(proposal, 1))

    @validate("busy_timeout")
    def _valid_busy_timeout(self, proposal: Any) -> float:
        return float(at_least(proposal, 0))

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._swept: set[str] = set()  # files whose leftovers of killed saves were looked for
        # Hashes of texts this store wrote in nbformat's own layout (bounded): editing such a text again
        # needs no check of its layout.
        self._nbformat_layout: OrderedDict[str, None] = OrderedDict()
        # What nbformat finds wrong with a text, by its hash (bounded): the pages of one big notebook are
        # validated once.
        self._problems: OrderedDict[str, list[str]] = OrderedDict()

    def _lock(self, path: str) -> asyncio.Lock:
        lock = self._locks.get(path)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[path] = lock
        return lock

    async def _check_path(self, path: str) -> str:
        path = path.strip("/")
        if not path.endswith(".ipynb"):
            raise BadRequest(f"Not a notebook (expected a path ending in .ipynb): {shown(path)}")
        cm = self.contents_manager
        if not path_allowed(path, getattr(cm, "root_dir", None)):
            # outside an agent token's path globs: absent, as the contents API answers too
            raise NotFound(f"Notebook not found: {shown(path)}")
        try:
            hidden = await ensure_async(cm.is_hidden(path))
        except ServerHTTPError as e:
            raise NotFound(f"Notebook not found: {shown(path)}") from e
        if hidden and not cm.allow_hidden:
            # The contents API answers 404 for hidden files too: do not reveal that they exist.
            raise NotFound(f"Notebook not found: {shown(path)}")
        return path

    def _os_path(self, path: str) -> str | None:
        try:
            return local_os_path(self.contents_manager, path)
        except ServerHTTPError as e:
            raise NotFound(f"Notebook not found: {path}") from e

    async def _load(self, path: str) -> LoadedNotebook:
        """Read and parse a notebook (``path`` already checked)."""
        os_path = self._os_path(path)
        if os_path is not None:
            return await self._load_from_disk(path, os_path)
        text = await self._read_text(path)
        try:
            nb, version = await _parse(text, path, content_hash(text.encode("utf-8")))
        except BadRequest:
            recovered = await self._recover_interrupted_save(path)
            if recovered is None:
                raise
            text = recovered
            nb, version = await _parse(text, path, content_hash(text.encode("utf-8")))
        return LoadedNotebook(path, nb, text, content_hash(text.encode("utf-8")), converted_from=version)

    async def _load_from_disk(self, path: str, os_path: str) -> LoadedNotebook:
        """Read a notebook's bytes from a local disk, waiting while another writer is saving it.

        A file that does not parse while another writer saves it answers 503 past ``busy_timeout``; only a
        save that stopped changing the file long ago (:data:`.disk.SAVE_IN_PROGRESS_SECONDS`) is treated
        as interrupted and restored by the contents manager, as jupyter_server restores it.
        """
        if not await ensure_async(self.contents_manager.file_exists(path)):
            raise NotFound(f"Notebook not found: {path}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.busy_timeout
        recovered = False
        while True:
            with path_errors(path):
                snapshot = await asyncio.to_thread(disk.read_snapshot, os_path)
            try:
                text = _decode(snapshot.data, path)
                nb, version = await _parse(text, path, snapshot.hash)
            except BadRequest:
                if disk.save_in_progress(os_path, snapshot):
                    if loop.time() >= deadline:
                        raise Unavailable(
                            f"Notebook is being saved by another writer right now and cannot be read yet: "
                            f"{path}; retry in a moment",
                            retry_after=BUSY_RETRY_AFTER,
                        ) from None
                    await asyncio.sleep(BUSY_POLL_SECONDS)
                    continue
                if recovered or not os.path.exists(disk.intermediate_path(os_path)):
                    raise
                recovered = await self._recover_interrupted_save(path) is not None
                if not recovered:
                    raise
                continue
            return LoadedNotebook(path, nb, text, snapshot.hash, os_path, version)

    async def _read_text(self, path: str) -> str:
        cm = self.contents_manager
        try:
            if not await ensure_async(cm.file_exists(path)):
                raise NotFound(f"Notebook not found: {path}")
            model = await ensure_async(cm.get(path, content=True, type="file", format="text"))
        except ServerHTTPError as e:
            if e.status_code == 404:
                raise NotFound(f"Notebook not found: {path}") from e
            if e.status_code == 400:
                raise BadRequest(f"Invalid JSON in notebook: {path}: {e.log_message}") from e
            raise
        text = model["content"]
        if not isinstance(text, str):
            raise BadRequest(f"Invalid JSON in notebook: {path}: not UTF-8 text")
        return text

    async def _recover_interrupted_save(self, path: str) -> str | None:
        """The notebook's text after the contents manager's own recovery of an interrupted save.

        A save killed half-way leaves the file truncated and the previous content in ``.~<name>``; the
        contents manager restores it when it reads the file *as a notebook* (reading as a file, as this
        store does for exact bytes, skips that). None when there was nothing to recover.
        """
        try:
            await ensure_async(self.contents_manager.get(path, content=True, type="notebook"))
        except Exception:
            # broad: the contents manager's recovery failing any way means there was nothing to recover
            return None
        self.log.warning("notebook %s was restored from an interrupted save", path)
        return await self._read_text(path)

    def _escapes_root(self, path: str) -> bool:
        """Whether the file behind ``path`` really lies outside the server root (through a symlink)."""
        try:
            os_path = local_os_path(self.contents_manager, path)
        except ServerHTTPError:
            return False
        if os_path is None:
            return False  # not a local-disk contents manager: it confines its own storage
        real = os.path.realpath(os_path)
        real_root = os.path.realpath(self.contents_manager.root_dir)
        return os.path.commonpath([real, real_root]) != real_root

    async def _open(self, path: str) -> LoadedNotebook | LiveNotebook:
        """The notebook's live document when a collaborative room has it open, else its file.

        ``path`` is one :meth:`_check_path` returned. For a live document there is no ``await`` between
        the read and the return, so a caller that goes on without awaiting sees and edits exactly what
        it read.
        """
        if self.live is not None:
            doc = await self.live.open(path)
            if doc is not None:
                return doc
        return await self._load(path)

    async def _read(self, path: str) -> LoadedNotebook | LiveNotebook:
        with path_errors(path.strip("/")):
            path = await self._check_path(path)
            async with self._lock(path):  # never read a file while this store is writing it
                return await self._open(path)

    async def read(
        self,
        path: str,
        *,
        include_binary: bool = False,
        view: ReadView | None = None,
        since: str | None = None,
    ) -> dict[str, Any]:
        """The notebook as an agent reads it: the cells ``view`` selects (all by default), summarized (see
        :func:`~.reading.read_notebook`). A large notebook is summarized in a thread.

        ``since`` (a hash an earlier answer gave): the answer's ``changes_since`` says which cells changed
        since that version and by whom, when the change ledger knows (see :meth:`Ledger.changes_since`)."""
        if since is not None:
            since = check_hash(since)
        loaded = await self._read(path)
        if view is None:
            view = ReadView(include_binary=include_binary)
        args = (loaded.notebook, loaded.path, loaded.hash, self.summary_max_chars, view)
        answer = await _off_loop_if_large(loaded.text, read_notebook, *args)
        answer.update(await self._fidelity(loaded))
        self._remember(loaded)
        if since is not None:
            if self.ledger is None:
                answer["changes_since"] = {"since": since, "since_known": False, "cells": []}
            else:
                answer["changes_since"] = await self.ledger.changes_since(
                    loaded.path, since, loaded.notebook, loaded.hash
                )
        return answer

    def _remember(self, loaded: LoadedNotebook | LiveNotebook) -> None:
        """Let the ledger remember the version a caller is answered (for a later read's ``since``)."""
        if self.ledger is not None:
            self.ledger.remember(loaded.path, loaded.hash, loaded.notebook)

    async def read_output(self, path: str, cell: str, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """(output ``n`` of cell ``cell`` as stored, the answer of the output route); see
        :func:`~.reading.read_output`. ``cell`` is a cell id or ``@index``."""
        loaded = await self._read(path)
        self._remember(loaded)
        return read_output(loaded.notebook, loaded.path, loaded.hash, cell, n)

    async def _fidelity(self, loaded: LoadedNotebook | LiveNotebook) -> dict[str, Any]:
        """What a read adds about the file itself: the version it was converted from, its problems."""
        fields: dict[str, Any] = {}
        if isinstance(loaded, LoadedNotebook) and loaded.converted_from is not None:
            fields["converted_from"] = loaded.converted_from
        problems = self._problems.get(loaded.hash)
        if problems is None:  # a new text: validate it once (a notebook of 5,000 cells takes ~0.25 s)
            problems = await asyncio.to_thread(notebook_problems, loaded.notebook)
            _remember(self._problems, loaded.hash, problems, PROBLEMS_MEMORY)
        if problems:
            fields["problems"] = list(problems)
        return fields

    async def load(self, path: str, *, writable: bool = False) -> tuple[str, dict[str, Any], str, bool]:
        """(checked path, the notebook dict, its hash, whether it is a live document) for a caller that
        works on whole cells (a notebook run). The dict must not be changed: use :meth:`change`.

        ``writable``: refuse a notebook that :meth:`change` would refuse to write as it is (403: a link to
        a file outside the server root; 400: older than nbformat 4, or invalid as found), before the
        caller does any work."""
        with path_errors(path.strip("/")):
            path = await self._check_path(path)
            if writable and self._escapes_root(path):
                raise AgentToolsError(
                    f"Refusing to run {path}: it resolves outside the server's root (it is a link to a file "
                    "outside it), and a run writes its outputs into the notebook; nothing was run",
                    403,
                )
            async with self._lock(path):
                loaded = await self._open(path)
        self._remember(loaded)
        if writable:
            if isinstance(loaded, LoadedNotebook) and loaded.converted_from is not None:
                raise BadRequest(needs_upgrade(path, loaded.converted_from))
            problems = await asyncio.to_thread(notebook_problems, loaded.notebook)
            if problems:
                raise BadRequest(invalid_as_found(path, problems))
        return path, loaded.notebook, loaded.hash, isinstance(loaded, LiveNotebook)

    async def edit(self, path: str, body: Any) -> dict[str, Any]:
        """Apply one operation or a batch atomically and save once; return the answer for the caller."""
        request = parse_edit_request(body, self.max_ops)
        repairs: list[str] = []
        upgraded: list[str] = []

        def transform(nb: dict[str, Any], hash_: str) -> tuple[dict[str, Any], EditOutcome]:
            if request.upgrade and _minor(nb) < 5:  # nbformat 4.4 or older 4.x: cells get ids
                upgraded[:] = [f"4.{_minor(nb)}"]
                nb, _ = repair_notebook({**nb, "nbformat_minor": 5}, hash_)
            if request.repair:
                nb, repairs[:] = repair_notebook(nb, hash_)
            outcome = apply_ops(nb, request.ops, id_seed=hash_, batch=request.batch)
            return outcome.notebook, outcome

        notes: dict[str, Any] = {}
        outcome, new_hash = await self.change(
            path,
            transform,
            expected_hash=request.expected_hash,
            upgrade=request.upgrade,
            notes=notes,
            actions=(["upgrade"] if upgraded else [])
            + (["repair"] if request.repair else [])
            + [op.action for op in request.ops],
        )
        if upgraded and "upgraded_from" not in notes:
            notes["upgraded_from"] = upgraded[0]
        answer: dict[str, Any] = {
            "message": outcome.message,
            "details": outcome.outcomes[-1].details,
            "hash": new_hash,
            "results": [{"message": o.message, "details": o.details} for o in outcome.outcomes],
        }
        if "upgraded_from" in notes:
            answer["upgraded_from"] = notes["upgraded_from"]
            answer["message"] += f" Upgraded the file from nbformat {notes['upgraded_from']} to 4.5."
        if request.repair:
            answer["repairs"] = list(repairs)
            if repairs:
                answer["message"] += f" Repaired {len(repairs)} problem(s) found in the notebook first."
        answer.update(_recorded_fields(notes))
        if answer.get("note") and "upgraded_from" not in answer:  # (an upgrade's message says it all)
            answer["message"] += " " + answer["note"]  # cannot be undone, or nothing changed
        return answer

    async def preview_edit(self, path: str, body: Any) -> dict[str, Any]:
        """What an edit would change, written nowhere (the approval gate shows it): the notebook's path and
        hash, a summary, and each cell it touches with its fields before and after and its source diff."""
        request = parse_edit_request(body, self.max_ops)
        path, notebook, hash_, _live = await self.load(path, writable=True)
        before = notebook
        if request.repair:
            notebook, _repairs = repair_notebook(notebook, hash_)
        outcome = apply_ops(notebook, request.ops, id_seed=hash_, batch=request.batch)
        return {
            "path": path,
            "hash": hash_,
            "cells_hash": cells_hash(before),
            **edit_diff(before, outcome.notebook),
        }

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        """Create the notebook ``path`` (``{"action": "create", "cells", "kernel_name", "parents"}``):
        nbformat 4.5 in nbformat's layout with the kernelspec set, created atomically and never over an
        existing file (409). Audited and recorded as a ``create`` change. Returns the read answer."""
        request = parse_create_request(body, self.max_ops)
        with path_errors(path.strip("/")):
            path = await self._check_path(path)
            if any(part in ("", ".", "..") for part in path.split("/")):
                raise BadRequest(f"A new notebook's path cannot have empty, '.' or '..' parts: {shown(path)}")
            kernelspec = await self._kernelspec(request.kernel_name)
            notebook = build_notebook(path, request.cells, kernelspec)
            validate_notebook(notebook, path)
            text = serialize_notebook(notebook)
            async with self._lock(path):
                if self._escapes_root(path):  # (before any folder is made)
                    raise AgentToolsError(
                        f"Refusing to create {path}: its folder links to a folder outside the server root",
                        403,
                    )
                await self._make_parents(path, request.parents)
                new_hash = await self._create_file(path, text)
        _remember(self._nbformat_layout, new_hash, None, NBFORMAT_LAYOUT_MEMORY)
        empty = {**notebook, "cells": []}
        self.audit.notebook_changed(
            path=path,
            actions=["create"],
            before=empty,
            after=notebook,
            hash_before="",
            hash_after=new_hash,
            live=False,
        )
        notes: dict[str, Any] = {}
        if self.ledger is not None:
            recorded = await self.ledger.record(path, empty, notebook, "", new_hash, kind="create")
            if recorded is not None:
                notes["ledger"] = recorded
        answer = read_notebook(notebook, path, new_hash, self.summary_max_chars, ReadView())
        n = len(notebook["cells"])
        answer["message"] = (
            f"Created {path} with {n} cell{'' if n == 1 else 's'} (kernel {kernelspec['name']})."
        )
        answer.update(_recorded_fields(notes))
        return answer

    async def _kernelspec(self, name: str | None) -> dict[str, str]:
        """``{name, display_name, language}`` of kernelspec ``name`` (None: the default) as the server's
        kernelspec manager describes it; 400 naming the installed ones when it has no such kernelspec."""
        ksm = self.kernel_spec_manager
        default = str(getattr(ksm, "default_kernel_name", None) or "python3")
        name = name or default
        if ksm is None:
            return {"name": name, "display_name": name, "language": "python" if name == default else ""}
        specs = await ensure_async(ksm.get_all_specs())
        found = specs.get(name) if isinstance(specs, dict) else None
        if not isinstance(found, dict):
            installed = ", ".join(sorted(specs)) if isinstance(specs, dict) else ""
            raise BadRequest(f"No such kernel: {name[:100]!r} (installed: {installed or 'none'})")
        raw = found.get("spec")
        spec: dict[str, Any] = raw if isinstance(raw, dict) else found
        return {
            "name": name,
            "display_name": str(spec.get("display_name") or name),
            "language": str(spec.get("language") or ""),
        }

    async def _make_parents(self, path: str, parents: bool) -> None:
        """Make sure the folder of ``path`` exists: 404 when it does not, unless ``parents`` (then each
        missing folder is made through the contents manager, each inside the caller's paths)."""
        cm = self.contents_manager
        folder = posixpath.dirname(path)
        if not folder or await ensure_async(cm.dir_exists(folder)):
            return
        if not parents:
            raise NotFound(f'Folder not found: {shown(folder)} (send "parents": true to create it)')
        parts = folder.split("/")
        for depth in range(1, len(parts) + 1):
            sub = "/".join(parts[:depth])
            if await ensure_async(cm.dir_exists(sub)):
                continue
            if not path_allowed(sub, getattr(cm, "root_dir", None)):
                raise NotFound(f"Folder not found: {shown(sub)}")
            if await ensure_async(cm.file_exists(sub)):
                raise Conflict(f"Cannot create folder {shown(sub)}: a file has that name")
            try:
                await ensure_async(cm.save({"type": "directory"}, sub))
            except ServerHTTPError as e:
                if e.status_code < 500:
                    raise AgentToolsError(e.log_message or f"Cannot create {sub}", e.status_code) from e
                raise

    async def _create_file(self, path: str, text: str) -> str:
        """Write a new file (409 if ``path`` exists): atomically, and never over another file, on a local
        disk; through the contents manager otherwise. Returns the hash of the bytes written."""
        cm = self.contents_manager
        exists = Conflict(f"Notebook already exists: {path} (read it, or edit it; nothing was written)")
        if await ensure_async(cm.exists(path)):
            raise exists
        model: dict[str, Any] = {"type": "file", "format": "text", "content": text}
        os_path = self._os_path(path)
        if os_path is None:
            try:
                await ensure_async(cm.save(model, path))
            except ServerHTTPError as e:
                if e.status_code < 500:
                    raise AgentToolsError(e.log_message or f"Cannot save {path}", e.status_code) from e
                raise
            return content_hash(text.encode("utf-8"))
        cm.run_pre_save_hooks(model=model, path=path)
        content = model.get("content")
        if not isinstance(content, str):
            raise AgentToolsError(f"A pre-save hook left no text to save for {path}", 500)
        data = content.encode("utf-8")
        if not await asyncio.to_thread(disk.create_exclusive, os_path, data):
            raise exists
        saved = await ensure_async(cm.get(path, content=False))
        cm.run_post_save_hooks(model=saved, os_path=os_path)
        emit = getattr(cm, "emit", None)
        if callable(emit):
            emit(data={"action": "save", "path": path})
        return content_hash(data)

    async def change(
        self,
        path: str,
        transform: Transform[T],
        *,
        expected_hash: str | None = None,
        upgrade: bool = False,
        notes: dict[str, Any] | None = None,
        actions: Sequence[str] = ("change",),
        audited: bool = True,
        undoes: str | None = None,
    ) -> tuple[T, str]:
        """Change a notebook atomically: ``transform(notebook, hash)`` gives the new notebook and a result;
        the new notebook is validated and saved once (or applied to the live document). Returns the
        result and the new hash. Every writer of the extension goes through here.

        The file is checked again just before it is replaced. If another writer changed it since it was
        read: with ``expected_hash``, 409; without, the transform is applied again to the new content
        (at most :data:`EDIT_ATTEMPTS` times, then 409), as if the request had come a moment later.

        A file is written in its own layout (:func:`.layout.render_edit`: the bytes of what did not change
        are kept). A file older than nbformat 4 is written only with ``upgrade`` (converted, in nbformat's
        layout; ``notes["upgraded_from"]`` then says from which version). A notebook invalid as found
        is refused with a message naming its problems.

        Each change is recorded (:meth:`Audit.notebook_changed`) as ``actions``, unless ``audited`` is
        False (a notebook run's intermediate output pushes: its final write of the cell is recorded), and
        entered in the change ledger (``notes["ledger"]``: its :class:`Recorded`); writes inside
        :meth:`grouped` become one entry, unaudited ones included. ``undoes``: the id of the change this
        one undoes. ``notes["live"]`` is set when the change went to a live document.
        """
        with path_errors(path.strip("/")):
            path = await self._check_path(path)
            if self._escapes_root(path):
                raise AgentToolsError(
                    f"Refusing to write {path}: it is a link to a file outside the server root", 403
                )
            async with self._lock(path):
                for _ in range(EDIT_ATTEMPTS):
                    loaded = await self._open(path)
                    # No await from here to the write-back of a live document (see _open()).
                    if expected_hash is not None and expected_hash != loaded.hash:
                        raise _changed(path, expected_hash, loaded.hash)
                    check_supported(loaded.notebook, path)
                    if isinstance(loaded, LiveNotebook):
                        notebook, result = transform(loaded.notebook, loaded.hash)
                        if _outside_cells(notebook) != _outside_cells(loaded.notebook):
                            raise BadRequest(
                                f"Notebook {path} is open in a collaborative room, where only its cells can "
                                "be changed (a repair of 'nbformat_minor' or of notebook metadata cannot be "
                                "applied there); close it in JupyterLab and retry"
                            )
                        validate_notebook(notebook, path, loaded.notebook)
                        new_hash = loaded.apply(notebook)
                        if notes is not None:
                            notes["live"] = True
                        if audited:
                            self._audit(path, actions, loaded, notebook, new_hash, live=True, undoes=undoes)
                        await self._record(path, actions, loaded, notebook, new_hash, notes, undoes, audited)
                        await loaded.persist(to_file=audited)
                        return result, new_hash
                    if loaded.converted_from is not None and not upgrade:
                        raise BadRequest(needs_upgrade(path, loaded.converted_from))
                    notebook, result = transform(loaded.notebook, loaded.hash)
                    known = True if loaded.hash in self._nbformat_layout else None
                    text, nbformat_layout = await asyncio.to_thread(_file_text, loaded, notebook, known)
                    saved, current = await self._save(loaded, text)
                    if saved is not None:
                        if nbformat_layout:
                            _remember(self._nbformat_layout, saved, None, NBFORMAT_LAYOUT_MEMORY)
                        if notes is not None and loaded.converted_from is not None:
                            notes["upgraded_from"] = loaded.converted_from
                        done = (["upgrade"] if loaded.converted_from is not None else []) + list(actions)
                        if audited:
                            self._audit(path, done, loaded, notebook, saved, live=False, undoes=undoes)
                        await self._record(path, done, loaded, notebook, saved, notes, undoes, audited)
                        return result, saved
                    if expected_hash is not None:
                        raise _changed(path, expected_hash, current)
                    self.log.info("notebook %s changed during an edit: applying the edit again", path)
                raise Conflict(
                    f"Notebook kept changing while this edit was being saved: {path} (another writer "
                    f"changed it {EDIT_ATTEMPTS} times in a row); read it again and retry"
                )

    def _audit(
        self,
        path: str,
        actions: Sequence[str],
        loaded: LoadedNotebook | LiveNotebook,
        notebook: dict[str, Any],
        new_hash: str,
        *,
        live: bool,
        undoes: str | None = None,
    ) -> None:
        if notebook is loaded.notebook:
            return  # the transform changed nothing (a run's cell that was deleted meanwhile)
        self.audit.notebook_changed(
            path=path,
            actions=actions,
            before=loaded.notebook,
            after=notebook,
            hash_before=loaded.hash,
            hash_after=new_hash,
            live=live,
            undoes=undoes,
        )

    async def _record(
        self,
        path: str,
        actions: Sequence[str],
        loaded: LoadedNotebook | LiveNotebook,
        notebook: dict[str, Any],
        new_hash: str,
        notes: dict[str, Any] | None,
        undoes: str | None,
        audited: bool = True,
    ) -> None:
        """Enter a write in the change ledger (see :meth:`change`). A write that is not audited (a run's
        outputs pushed to a live room while a cell runs) still joins its group: the run's one change
        then starts from the outputs the cells had before the run."""
        if self.ledger is None or notebook is loaded.notebook:
            return
        if not audited and not self.ledger.grouping(path):
            return
        recorded = await self.ledger.record(
            path,
            loaded.notebook,
            notebook,
            loaded.hash,
            new_hash,
            kind=change_kind(actions),
            undoes=undoes,
            saved=audited,
        )
        if recorded is not None and notes is not None:
            notes["ledger"] = recorded

    @contextlib.asynccontextmanager
    async def grouped(self, path: str, kind: str) -> AsyncIterator[ChangeGroup | None]:
        """Writes to ``path`` inside the block (and the tasks it starts) are one ledger entry (a notebook
        run: one change, not one per cell); ``group.fields()`` then has its id. None: no ledger."""
        if self.ledger is None or not self.ledger.enabled:
            yield None
            return
        with path_errors(path.strip("/")):
            path = await self._check_path(path)
        async with self.ledger.group(path, kind) as group:
            yield group

    async def changes(
        self, path: str, *, limit: int | None = None, before: str | None = None
    ) -> dict[str, Any]:
        """The recorded changes of ``path``, newest first (see :meth:`Ledger.notebook_changes`)."""
        with path_errors(path.strip("/")):
            path = await self._check_path(path)
        if self.ledger is None:
            return {"path": path, "changes": [], "next_before": None}
        return await self.ledger.notebook_changes(path, limit=limit, before=before)

    async def change_detail(self, path: str, change_id: str) -> dict[str, Any]:
        """One recorded change of ``path`` with its cells' before and after (see :meth:`Ledger.get`)."""
        with path_errors(path.strip("/")):
            path = await self._check_path(path)
        if self.ledger is None:
            raise NotFound(f"No change {change_id} of {path}: the change ledger is off on this server")
        return await self.ledger.get(path, change_id)

    async def undo(self, path: str, change_id: str, body: Any = None) -> dict[str, Any]:
        """Undo change ``change_id`` of ``path`` as one atomic write, itself recorded (with ``undoes``).

        409 naming the cells when any cell it would touch changed since that change; nothing is written.
        Not a conflict: a cell run since (only its outputs changed); when the change set its source, the
        undo clears those outputs (``outputs_cleared``). ``body``: nothing, or ``{"expected_hash": ...}``.
        """
        expected_hash = parse_undo_request(body)
        if self.ledger is None:
            raise NotFound(f"No change {change_id} of {path}: the change ledger is off on this server")
        with path_errors(path.strip("/")):
            path = await self._check_path(path)
        plan = await self.ledger.plan(path, change_id)
        entry = plan.entry
        if plan.not_undoable is not None:
            raise BadRequest(f"Change {entry['id']} of {path} cannot be undone: {plan.not_undoable}")
        if plan.replaced is not None:
            raise Conflict(
                f"Change {entry['id']} of {path} cannot be undone: the notebook it changed was replaced "
                f"since ({plan.replaced}); the file at {path} is another notebook now. Nothing was written"
            )

        cleared: list[str] = []

        def transform(nb: dict[str, Any], _hash: str) -> tuple[dict[str, Any], None]:
            checked = check_undo(plan.cells, nb)
            found = checked.conflicts
            if found:
                named = "; ".join(f"cell {c.id}: {c.what}" for c in found)
                raise Conflict(
                    f"Change {entry['id']} of {path} cannot be undone: {named}. Nothing was written; read "
                    "the notebook and change those cells yourself, or undo the later change first",
                    extra={"conflicts": [c.as_dict() for c in found]},
                )
            cleared[:] = checked.outputs_cleared  # the transform may run again (a retried write)
            return inverse(plan.cells, nb, cleared), None

        notes: dict[str, Any] = {}
        _, new_hash = await self.change(
            path, transform, expected_hash=expected_hash, actions=["undo"], notes=notes, undoes=entry["id"]
        )
        message = f"Undid change {entry['id']} ({entry['action']}) of {path}."
        if cleared:
            them = "it" if len(cleared) == 1 else "them"
            message += (
                f" Cleared the outputs of {_cells_named(cleared)}: they came from the source this undid "
                f"(run {them} again for the restored source's)."
            )
        answer = {
            "message": message,
            "hash": new_hash,
            "undoes": entry["id"],
            "cells": entry["cells"],
            "outputs_cleared": list(cleared),
        }
        answer.update(_recorded_fields(notes))
        return answer

    async def contents_save(self, path: str, save: Callable[[], Awaitable[T]]) -> T:
        """Make a save that came through the contents API (``save()``: the contents manager's own, as
        asked) and, when it overwrote cells that recorded changes left (a stale copy saved by JupyterLab
        without real-time collaboration), record it in the ledger as an ``overwrite`` (see
        :meth:`Ledger.record_save`). A notebook no recorded change touched costs one look-up in memory;
        the save is never refused or changed."""
        path = path.strip("/")
        if self.ledger is None or not path.endswith(".ipynb") or not await self.ledger.has_changes(path):
            return await save()
        async with self._lock(path):  # no edit of ours between the file before and after the save
            before = await self._saved_version(path)
            result = await save()
            after = await self._saved_version(path) if before is not None else None
        if before is not None and after is not None and before.hash != after.hash:
            await self.ledger.record_save(path, before.notebook, after.notebook, before.hash, after.hash)
        return result

    async def _saved_version(self, path: str) -> LoadedNotebook | None:
        """The notebook in the file (never a live room's document), or None when it cannot be read."""
        try:
            with path_errors(path):
                return await self._load(path)
        except (AgentToolsError, OSError, ServerHTTPError):
            return None

    async def _save(self, loaded: LoadedNotebook, text: str) -> tuple[str | None, str]:
        """Save ``text`` over ``loaded`` unless the file changed since it was read.

        Returns (hash of the saved bytes, "") when saved, else (None, hash of the file as it is now).
        """
        path = loaded.path
        cm = self.contents_manager
        os_path = loaded.os_path
        try:
            # Like the contents API does for notebooks, keep one checkpoint: the state before the
            # first edit stays recoverable with "Revert to checkpoint".
            if not await ensure_async(cm.list_checkpoints(path)):
                await ensure_async(cm.create_checkpoint(path))
            if os_path is None or not os.access(os.path.dirname(os.path.realpath(os_path)), os.W_OK):
                # Not a local disk, or no temporary file can be made next to it (the contents manager
                # then writes in place, as jupyter_server does in a read-only directory).
                current = content_hash((await self._read_text(path)).encode("utf-8"))
                if current != loaded.hash:
                    return None, current
                await ensure_async(cm.save({"type": "file", "format": "text", "content": text}, path))
                return content_hash(text.encode("utf-8")), ""
            return await self._save_to_disk(loaded, os_path, text)
        except ServerHTTPError as e:
            if e.status_code < 500:
                raise AgentToolsError(e.log_message or f"Cannot save {path}", e.status_code) from e
            raise

    async def _save_to_disk(self, loaded: LoadedNotebook, os_path: str, text: str) -> tuple[str | None, str]:
        """What ``contents_manager.save`` does for a file, with an atomic write instead of an in-place one."""
        cm, path = self.contents_manager, loaded.path
        target = os.path.realpath(os_path)  # a link inside the root: write the file it points to
        if not os.access(target, os.W_OK):
            raise AgentToolsError(f"Permission denied: {path}", 403)
        model: dict[str, Any] = {"type": "file", "format": "text", "content": text}
        cm.run_pre_save_hooks(model=model, path=path)
        content = model.get("content")
        if not isinstance(content, str):
            raise AgentToolsError(f"A pre-save hook left no text to save for {path}", 500)
        data = content.encode("utf-8")
        tmp = await asyncio.to_thread(disk.write_temporary, target, data)
        # No await between the check and the rename (see replace_if_unchanged()).
        current = disk.replace_if_unchanged(tmp, target, loaded.hash)
        if current is not None:
            return None, current
        if target not in self._swept:  # a killed server's temporary files: once per file and process
            self._swept.add(target)
            await asyncio.to_thread(disk.remove_stale_temporaries, target)
        saved = await ensure_async(cm.get(path, content=False))
        cm.run_post_save_hooks(model=saved, os_path=os_path)
        emit = getattr(cm, "emit", None)
        if callable(emit):
            emit(data={"action": "save", "path": path})
        return content_hash(data), ""


def change_kind(actions: Sequence[str]) -> str:
    """What kind of change a write with these actions is, as the ledger lists it."""
    if "undo" in actions:
        return "undo"
    if "create" in actions:
        return "create"
    if any(a.startswith("run_") for a in actions):
        return "run"
    if "upgrade" in actions:
        return "upgrade"
    if "repair" in actions:
        return "repair"
    if actions and all(a == "clear_outputs" for a in actions):
        return "clear_outputs"
    return "edit"


def parse_undo_request(body: Any) -> str | None:
    """The ``expected_hash`` of an undo's body (none, ``{}`` or ``{"expected_hash": str}``); 400 otherwise."""
    if body is None:
        return None
    check("UndoRequest", body)
    value = body.get("expected_hash")
    return value if isinstance(value, str) else None


def _recorded_fields(notes: dict[str, Any]) -> dict[str, Any]:
    recorded = notes.get("ledger")
    return recorded.fields() if isinstance(recorded, Recorded) else {}


def _outside_cells(nb: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in nb.items() if k != "cells"}


def _minor(nb: dict[str, Any]) -> int:
    minor = nb.get("nbformat_minor")
    return minor if isinstance(minor, int) and not isinstance(minor, bool) else 5


async def _parse(text: str, path: str, seed: str) -> tuple[dict[str, Any], str | None]:
    """:func:`parse_any_notebook`, in a thread for a large notebook."""
    return await _off_loop_if_large(text, parse_any_notebook, text, path, seed)


def _remember(memory: OrderedDict[str, V], key: str, value: V, limit: int) -> None:
    """Put ``key`` in a bounded memory as its newest entry, forgetting the oldest past ``limit``."""
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > limit:
        memory.popitem(last=False)


def _file_text(
    loaded: LoadedNotebook, notebook: dict[str, Any], nbformat_layout: bool | None = None
) -> tuple[str, bool]:
    """The text to save for ``notebook``, validated, and whether it is in nbformat's layout: the file's own
    layout, or nbformat's for a converted file (runs in a thread: validation and layout take a while on
    big notebooks). ``nbformat_layout``: whether ``loaded.text`` is known to be in nbformat's layout
    (``None``: look)."""
    if loaded.converted_from is not None:
        validate_notebook(notebook, loaded.path)
        return serialize_notebook(notebook), True
    notebook = follow_source_style(loaded.notebook, notebook)
    validate_notebook(notebook, loaded.path, loaded.notebook)
    if nbformat_layout is None:
        nbformat_layout = serialize_notebook(loaded.notebook) == loaded.text
    if nbformat_layout:
        # Every file JupyterLab saved: writing it whole gives the bytes the splice would, several times
        # faster.
        return serialize_notebook(notebook), True
    return render_edit(loaded.text, notebook), False


async def _off_loop_if_large(text: str, func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` on the event loop for a small notebook, in a thread for one of megabytes."""
    if len(text) < OFF_LOOP_CHARS:
        return func(*args)
    return await asyncio.to_thread(func, *args)


def _decode(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"Invalid JSON in notebook: {path}: not UTF-8 encoded") from None


def _changed(path: str, expected: str, current: str) -> Conflict:
    return Conflict(
        f"Notebook changed since it was read: {path} (expected_hash {expected}, current hash "
        f"{current or '(file removed)'}); read it again and retry"
    )


def _cells_named(ids: Sequence[str]) -> str:
    """``cell a``, ``cells a and b``, ``cells a, b and c``."""
    if len(ids) == 1:
        return f"cell {ids[0]}"
    return f"cells {', '.join(ids[:-1])} and {ids[-1]}"
