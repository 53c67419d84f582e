"""Validation shared by the traits of the application and of its services."""

from __future__ import annotations

import logging
from typing import Any

from traitlets import TraitError


def trait_name(proposal: Any) -> str:
    """``Class.trait`` of a ``@validate`` proposal, as the error messages name it."""
    return f"{type(proposal['owner']).__name__}.{proposal['trait'].name}"


def at_least(proposal: Any, low: float, *, strict: bool = False) -> Any:
    """The proposed number if it is ``>= low`` (``> low`` when ``strict``), else a TraitError naming the
    trait. NaN is refused."""
    value = proposal["value"]
    if not (value > low if strict else value >= low):
        bound = f"greater than {low}" if strict else f"at least {low}"
        raise TraitError(f"{trait_name(proposal)} must be {bound}, got {value}")
    return value


def default_log(owner: Any, module: str) -> logging.Logger | logging.LoggerAdapter[Any]:
    """The log of a service: its parent's (the application's) when it has one, else its module's."""
    parent = getattr(owner, "parent", None)
    if parent is not None and getattr(parent, "log", None) is not None:
        return parent.log
    return logging.getLogger(module)
