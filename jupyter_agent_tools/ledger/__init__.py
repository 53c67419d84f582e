"""The change ledger: what the extension changed in notebooks, who asked, and how to undo it.

:mod:`.changes`, :mod:`.undo`, :mod:`.since` and :mod:`.text` are pure; :mod:`.service` keeps the
SQLite database (import it from there).
"""
