"""The change ledger: what the extension changed in notebooks, who asked, and how to undo it."""

from .service import ChangeGroup, Ledger, Recorded

__all__ = ["ChangeGroup", "Ledger", "Recorded"]
