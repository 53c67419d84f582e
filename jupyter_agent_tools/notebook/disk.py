"""Notebook files on a local disk: whole-file reads, telling a save in progress from a broken file, and
atomic replacement that refuses to overwrite a file someone else changed.

jupyter_server's "atomic" save copies the file to ``.~<name>`` and then writes the file IN PLACE, so a
reader can see it truncated or half written; its notebook read, on a file that does not parse, moves the
file to ``<name>.invalid`` and restores the copy. This module never does that on a file that is being
written: see :func:`save_in_progress`. Its own writes go to a temporary file in the same directory,
are flushed to disk and renamed over the notebook, so a reader (or a crash) sees the old file or the new
one, never a mix.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import re
import secrets
import stat
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .format import content_hash

log = logging.getLogger(__name__)

# A file that does not parse, changed less than this many seconds ago, and either looks cut off or has
# jupyter's .~ copy next to it is a save in progress, not a broken or interrupted file. jupyter_server's
# in-place writer fills a truncated file within a second even for a notebook of tens of MB; ten seconds
# leave room for a loaded machine. Past it, a .~ copy is a save killed half-way, restored as jupyter does.
SAVE_IN_PROGRESS_SECONDS = 10.0

# What can end a JSON text that was cut off inside a token, from the position the parser complains about:
# a prefix of a literal or a number, or of a \uXXXX escape (a complete high surrogate waits for its pair).
_TOKEN_PREFIX = re.compile(
    r"n(?:u(?:ll?)?)?|t(?:r(?:ue?)?)?|f(?:a(?:l(?:se?)?)?)?"
    r"|-?[0-9]*(?:\.[0-9]*)?(?:[eE][-+]?[0-9]*)?"
    r"|u[0-9a-fA-F]{0,4}"
)


_TEMPORARY = re.compile(r"[0-9a-f]{8}\.tmp")  # what follows ".~<name>." in write_temporary()'s names


@dataclass(frozen=True)
class Snapshot:
    """The bytes of a file and its modification time, read through one open file."""

    data: bytes
    mtime_ns: int

    @cached_property
    def hash(self) -> str:  # read twice per load: hashing megabytes once is enough
        return content_hash(self.data)


def read_snapshot(os_path: str) -> Snapshot:
    with open(os_path, "rb") as f:
        mtime_ns = os.fstat(f.fileno()).st_mtime_ns
        return Snapshot(f.read(), mtime_ns)


def intermediate_path(os_path: str) -> str:
    """Where jupyter_server's atomic_writing keeps the previous file while it writes (``.~<name>``)."""
    directory, name = os.path.split(os_path)
    return os.path.join(directory, ".~" + name)


def looks_cut_off(data: bytes) -> bool:
    """Whether ``data`` could be the beginning of a JSON text, cut off by a writer not finished yet.

    True for an empty file and for every proper prefix of a valid JSON text; False for JSON that is
    broken in the middle or followed by more data.
    """
    if not data.strip():
        return True
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.reason == "unexpected end of data"  # a multi-byte character cut at the end
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg.startswith("Unterminated string"):
            return True
        return _TOKEN_PREFIX.fullmatch(text[e.pos :].rstrip()) is not None
    return False


def save_in_progress(os_path: str, snapshot: Snapshot) -> bool:
    """Whether a snapshot that does not parse is another writer's save that is not finished yet."""
    recent = time.time() - snapshot.mtime_ns / 1e9 < SAVE_IN_PROGRESS_SECONDS
    return recent and (os.path.exists(intermediate_path(os_path)) or looks_cut_off(snapshot.data))


def write_temporary(target: str, data: bytes) -> str:
    """Write ``data`` to a new hidden file next to ``target``, with its permission bits, flushed to disk.

    Returns the temporary file's path, to pass to :func:`replace_if_unchanged`.
    """
    directory, name = os.path.split(target)
    info = os.stat(target)
    tmp = os.path.join(directory, f".~{name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            os.chmod(tmp, stat.S_IMODE(info.st_mode))
            if hasattr(os, "chown") and info.st_uid != os.geteuid():
                with contextlib.suppress(OSError):  # only root can give it back to its owner
                    os.chown(tmp, info.st_uid, info.st_gid)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        discard(tmp)
        raise
    return tmp


def remove_stale_temporaries(target: str) -> None:
    """Remove temporary files of saves of ``target`` killed before their rename (unchanged for a while)."""
    directory, name = os.path.split(target)
    prefix = f".~{name}."
    limit = time.time() - SAVE_IN_PROGRESS_SECONDS
    with contextlib.suppress(OSError), os.scandir(directory or ".") as entries:
        for entry in entries:
            if entry.name.startswith(prefix) and _TEMPORARY.fullmatch(entry.name[len(prefix) :]):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime < limit:
                        os.unlink(entry.path)


def replace_if_unchanged(tmp: str, target: str, expected_hash: str) -> str | None:
    """Rename ``tmp`` over ``target`` if ``target`` still holds the bytes hashed ``expected_hash``.

    Returns None when done, else the hash of what ``target`` holds now (``""`` if it is gone) and removes
    ``tmp``. No ``await`` in here: on the event loop, no other save of this server can slip in between the
    check and the rename. Another process can, within microseconds: where the system can swap two names
    atomically (Linux ``renameat2(RENAME_EXCHANGE)``) the file the rename displaced is checked too, and put
    back if it is not the one checked; elsewhere such a change is lost.
    """
    try:
        with open(target, "rb") as f:
            checked = os.fstat(f.fileno())
            current = content_hash(f.read())
    except FileNotFoundError:
        current = ""
    if current != expected_hash:
        discard(tmp)
        return current
    ours = os.lstat(tmp)
    try:
        swapped = exchange(tmp, target)
    except FileNotFoundError:  # removed since the check
        discard(tmp)
        return ""
    if not swapped:
        os.replace(tmp, target)
    elif not _holds(tmp, checked, expected_hash):
        # Another writer replaced the file between the check and the swap: give its file back.
        log.info("%s was replaced by another writer while it was being saved: its file was put back", target)
        exchange(tmp, target)
        if not os.path.samestat(os.lstat(tmp), ours):  # and again since: the newest one goes back
            exchange(tmp, target)
        discard(tmp)
        return _hash_of(target)
    else:
        discard(tmp)  # the file that was checked
    _sync_directory(os.path.dirname(target))
    return None


def exchange(a: str, b: str) -> bool:
    """Swap the files at two paths atomically; False where the system or file system cannot."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), b)


def _load_renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_renameat2 = _load_renameat2()


def _holds(path: str, checked: os.stat_result, expected_hash: str) -> bool:
    """Whether ``path`` is the file ``checked`` describes, still with the bytes hashed ``expected_hash``."""
    with open(path, "rb") as f:
        return os.path.samestat(os.fstat(f.fileno()), checked) and content_hash(f.read()) == expected_hash


def _hash_of(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return content_hash(f.read())
    except FileNotFoundError:
        return ""


def discard(tmp: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


def _sync_directory(directory: str) -> None:
    """Make the rename durable (a crash of the machine right after keeps the new name)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY)
    except OSError:
        return  # e.g. Windows cannot open a directory: the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def create_exclusive(target: str, data: bytes) -> bool:
    """Create ``target`` holding ``data``, atomically: a reader sees no file or the whole file, and an
    existing file is never replaced. False when ``target`` exists (nothing written).

    The bytes go to a temporary file next to it (flushed to disk), which is then hard-linked to the name:
    ``link`` fails if the name exists. Where the file system has no hard links, the file is created
    with ``O_EXCL`` and written in place.
    """
    directory, name = os.path.split(target)
    tmp = os.path.join(directory, f".~{name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            try:
                with open(target, "xb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except FileExistsError:
                return False
    finally:
        discard(tmp)
    _sync_directory(directory)
    return True
