"""The pure parts of agent tokens: path globs and normalization, scopes, the token store (no server)."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from jupyter_agent_tools.auth.paths import GlobError, PathScope, normalize
from jupyter_agent_tools.auth.scopes import effective, needed, parse_scopes, refusal
from jupyter_agent_tools.auth.store import TOKEN_PREFIX, TokenStore, token_hash
from jupyter_agent_tools.errors import BadRequest, Conflict, NotFound

pytestmark = pytest.mark.quick  # the fast tier: no server, no kernel


@pytest.mark.parametrize(
    ("path", "normal"),
    [
        ("reports/a.ipynb", "reports/a.ipynb"),
        ("/reports//./a.ipynb", "reports/a.ipynb"),
        ("reports/../secret.ipynb", "secret.ipynb"),
        ("reports/x/../../secret.ipynb", "secret.ipynb"),
        ("", ""),
        ("/", ""),
        ("..", None),
        ("../etc/passwd", None),
        ("reports/../../etc/passwd", None),
        ("a\x00b", None),
    ],
)
def test_request_paths_are_normalized_and_cannot_climb_above_the_root(path: str, normal: str | None) -> None:
    assert normalize(path) == normal


GLOBS = {
    "reports/**": (
        ["reports", "reports/a.ipynb", "reports/2024/q1/a.ipynb"],
        ["", "reportsx", "reports.ipynb", "other/reports/a.ipynb", "secret.ipynb"],
    ),
    "**/*.ipynb": (["a.ipynb", "x/y/z.ipynb"], ["a.txt", "x/y", "", "x.ipynb/y.txt"]),
    "reports/*.ipynb": (["reports/a.ipynb"], ["reports", "reports/x/a.ipynb", "reports/a.txt"]),
    "data/q?.csv": (["data/q1.csv"], ["data/q10.csv", "data/q/.csv"]),
    "data/[ab]*.csv": (["data/a1.csv", "data/b.csv"], ["data/c.csv"]),
    "data/[!ab]*.csv": (["data/c.csv"], ["data/a.csv"]),
    "**": (["", "a", "a/b/c"], []),
    "a.b+(c)": (["a.b+(c)"], ["aXb+(c)", "a.bb+(c)"]),
}


@pytest.mark.parametrize("glob", sorted(GLOBS))
def test_path_globs_match_by_segment(glob: str) -> None:
    inside, outside = GLOBS[glob]
    scope = PathScope([glob])
    for path in inside:
        assert scope.allows(path), (glob, path)
    for path in outside:
        assert not scope.allows(path), (glob, path)


@pytest.mark.parametrize("glob", ["", "   ", "../x/**", "a/../../b", "/", ".", "a\x00b", "x" * 300])
def test_unusable_globs_are_refused_saying_why(glob: str) -> None:
    with pytest.raises(GlobError):
        PathScope([glob])


def test_symlinks_must_lead_inside_the_globs(tmp_path: Path) -> None:
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "a.ipynb").write_text("{}")
    (tmp_path / "secret.ipynb").write_text("{}")
    os.symlink(tmp_path / "secret.ipynb", tmp_path / "reports" / "out.ipynb")
    os.symlink(tmp_path / "reports" / "a.ipynb", tmp_path / "reports" / "in.ipynb")
    os.symlink("/", tmp_path / "reports" / "root")
    scope = PathScope(["reports/**"])
    root = str(tmp_path)
    assert scope.allows("reports/a.ipynb", root) and scope.allows("reports/in.ipynb", root)
    assert scope.allows("reports/new.ipynb", root)  # not there yet: its directory is inside
    assert not scope.allows("reports/out.ipynb", root)
    assert not scope.allows("reports/root/etc/passwd", root)
    assert scope.allows("reports/out.ipynb")  # without a local root only the name counts


def test_scopes_grant_pairs_and_name_what_is_missing() -> None:
    assert effective({"edit"}) == {"read", "edit"} and effective({"execute"}) == {"execute"}
    assert needed("contents", "write") == "edit" and needed("kernels", "execute") == "execute"
    assert needed("server", "write") is None and needed("agent_tokens", "read") is None
    assert refusal(effective({"read"}), "contents", "read") is None
    assert "'edit' scope" in str(refusal(effective({"read"}), "contents", "write"))
    assert "'execute' scope" in str(refusal(effective({"read", "edit"}), "terminals", "read"))
    assert "never allowed" in str(refusal(effective({"read", "edit", "execute"}), "events", "write"))
    with pytest.raises(ValueError, match="unknown scope 'admin'"):
        parse_scopes(["read", "admin"])
    with pytest.raises(ValueError, match="at least one scope"):
        parse_scopes([])


def test_store_keeps_hashes_only_and_sees_another_processes_writes(tmp_path: Path) -> None:
    path = tmp_path / "data" / "agent_tokens.db"
    now = [1000.0]
    store = TokenStore(str(path), clock=lambda: now[0])
    token, record = store.create("bot", ["read"], ["reports/**"], expires_in=3600)
    assert token.startswith(TOKEN_PREFIX) and record.token_hash == token_hash(token)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token.encode() not in b"".join(p.read_bytes() for p in path.parent.iterdir())
    assert store.lookup(token) == record and store.lookup(token + "x") is None
    assert store.lookup("jat_" + "A" * 43) is None
    with pytest.raises(Conflict):
        store.create("bot", ["read"])
    for bad in (("x y", ["read"]), ("x", ["nope"]), ("x", [])):
        with pytest.raises(BadRequest):
            store.create(*bad)
    with pytest.raises(BadRequest, match="expires_in"):
        store.create("x", ["read"], expires_in=1)
    now[0] += 3601
    assert store.lookup(token).status(now[0]) == "expired"  # type: ignore[union-attr]
    # another process (a second server on the same data dir) revokes it: seen at the next lookup
    other = TokenStore(str(path), clock=lambda: now[0])
    other.revoke("bot")
    assert store.lookup(token).status(now[0]) == "revoked"  # type: ignore[union-attr]
    with pytest.raises(NotFound):
        store.revoke("bot")
    # last use is written at most once a minute
    fresh, _ = store.create("bot", ["read"])
    record = store.lookup(fresh)
    assert record is not None
    store.touch(record)
    store.settle()  # written in the store's writer thread, never waited for by the caller
    first = store.lookup(fresh).last_used  # type: ignore[union-attr]
    assert first == now[0]
    now[0] += 10
    store.touch(record)
    store.settle()
    with sqlite3.connect(path) as db:
        stored = db.execute("SELECT last_used FROM agent_tokens WHERE token_hash = ?", (record.token_hash,))
        assert stored.fetchone()[0] == first
    assert [t.last_used for t in store.tokens() if t.name == "bot" and t.revoked is None] == [now[0]]
    store.close()
    other.close()


def test_store_under_a_lock_answers_at_once_and_a_change_says_it_failed(tmp_path: Path) -> None:
    """Another connection holds the file's write lock: checking and last use do not wait, a revoke waits
    at most write_timeout and raises 503 naming the file (nothing revoked); a corrupt file is a 503 too."""
    import time

    from jupyter_agent_tools.auth.store import TokenStoreUnavailable

    path = tmp_path / "agent_tokens.db"
    store = TokenStore(str(path), write_timeout=0.3)
    token, record = store.create("bot", ["read"])
    started = time.perf_counter()
    assert store.lookup(token) == record
    baseline = time.perf_counter() - started  # a lookup with nobody holding the lock
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        started = time.perf_counter()
        assert store.lookup(token) == record
        store.touch(record)
        assert time.perf_counter() - started < 0.3 / 2 + 10 * baseline  # it never waits write_timeout
        started = time.perf_counter()
        with pytest.raises(TokenStoreUnavailable) as refused:
            store.revoke("bot")
        assert 0.25 < time.perf_counter() - started < 2 * 0.3 + 10 * baseline + 1
        assert refused.value.status == 503 and str(path) in refused.value.message
        assert "NOT revoked" in refused.value.message and "locked" in refused.value.message
        assert store.lookup(token).status(store.now()) == "active"  # type: ignore[union-attr]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.revoke("bot").revoked is not None
    store.close()
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"not a database " * 100)
    with pytest.raises(TokenStoreUnavailable, match=str(corrupt)):
        TokenStore(str(corrupt))
