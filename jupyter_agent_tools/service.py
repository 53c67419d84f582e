"""What the services share: their base class and the validation of their traits."""

from __future__ import annotations

import logging
from typing import Any

from traitlets import TraitError, default
from traitlets.config import LoggingConfigurable


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


def in_range(proposal: Any, low: int, high: int, unit: str = "bytes") -> int:
    """The proposed integer if ``low <= value <= high``, else a TraitError naming the trait and its range."""
    value = int(proposal["value"])
    if not low <= value <= high:
        raise TraitError(f"{trait_name(proposal)} must be between {low} and {high} {unit}, got {value}")
    return value


class Service(LoggingConfigurable):
    """A service of the extension: its settings are validated ``config=True`` traits, configured as
    ``c.<ServiceClass>.<trait>`` (the application builds it with ``parent=`` itself, so the server's
    configuration reaches it); it logs to its parent's (the application's) log when it has one, else to
    its module's logger."""

    @default("log")
    def _default_log(self) -> Any:
        parent = self.parent
        if parent is not None and getattr(parent, "log", None) is not None:
            return parent.log
        return logging.getLogger(type(self).__module__)


def honour_moved_settings(service: Service, old_section: str, names: tuple[str, ...], since: str) -> None:
    """Settings that moved to ``service``'s class from ``c.<old_section>.<name>``: a value set there still
    applies, with a deprecation warning naming the new place, unless ``c.<Class>.<name>`` is set too
    (jupyter_server's ``_deprecated_traits``, across classes). Call it at the end of ``__init__``."""
    if old_section not in service.config:
        return
    old = service.config[old_section]
    new = type(service).__name__
    mine = service.config.get(new, {})
    for name in names:
        if name in old and name not in mine:
            service.log.warning(
                "c.%s.%s is deprecated since jupyter-agent-tools %s: set c.%s.%s (the value is used there)",
                old_section,
                name,
                since,
                new,
                name,
            )
            setattr(service, name, old[name])
