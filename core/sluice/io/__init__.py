"""Neutral I/O plumbing that checkpoint storage and sinks share (:mod:`sluice.io.s3`).

A leaf of the import graph: it imports only :mod:`sluice.errors` and third-party libraries, so the
checkpoint storage and the sinks both stand on it without either importing the other.
"""

__all__: list[str] = []
