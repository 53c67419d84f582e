"""The one place that relies on jupyter_server internals.

Tested with jupyter_server 2.21 (``FileContentsManager``, ``AsyncFileContentsManager`` and the large-file
managers). ``tests/test_compat.py`` fails loudly if the upstream shape changes.
"""

from __future__ import annotations

from typing import Any


def local_os_path(contents_manager: Any, path: str) -> str | None:
    """The file system path behind API ``path``, or None when the contents manager is not a local disk.

    A local-disk contents manager is a ``FileContentsManager`` or ``AsyncFileContentsManager`` (or a
    subclass) that keeps their private ``_get_os_path(path)`` and a ``root_dir``: it maps an API path to
    an absolute path under ``root_dir`` and raises ``tornado.web.HTTPError(404)`` for a path outside the
    root (checked with jupyter_server 2.21). Any other contents manager (a database, S3...) gives None.
    """
    get_os_path = getattr(contents_manager, "_get_os_path", None)
    root = getattr(contents_manager, "root_dir", None)
    if not callable(get_os_path) or not isinstance(root, str) or not root:
        return None
    os_path = get_os_path(path)
    return os_path if isinstance(os_path, str) else None
