"""What an armed fault raises: a simulated crash, or an ordinary error that declines a checkpoint."""

from __future__ import annotations

__all__ = ["InjectedDecline", "InjectedFault"]


class InjectedFault(BaseException):
    """Raised at an armed point: the test's stand-in for a crash.

    It derives from ``BaseException``, like ``SystemExit``: a crashing process runs no ``except Exception``
    handler, so neither may a simulated crash (commit retries, checkpoint declines).
    """


class InjectedDecline(Exception):
    """Raised at an armed ``"decline"`` point: an ordinary error, so the task declines the checkpoint."""
