"""The approval gate: what agents must ask the person first (policy), the requests and decisions."""

from .records import Approval
from .service import ApprovalPolicy, Forbidden, TooLarge, TooManyPending

__all__ = ["Approval", "ApprovalPolicy", "Forbidden", "TooLarge", "TooManyPending"]
