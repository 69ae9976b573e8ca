"""At job start, before the first attempt: can each sink's output be reached and written?

Each sink probes its own output (:meth:`sluice.sink.Sink.probe`: a file written and deleted, a connection
opened, a table or topic looked up). A probe that fails fails the job at once, with one line naming the
operator and what its sink said (the option to fix): a restart would meet the same unwritable folder,
missing bucket, wrong credentials or unknown topic, so none is spent on it.
"""

from __future__ import annotations

import logging
from typing import Any

from sluice.errors import ConfigError
from sluice.graph import JobGraph, NodeKind
from sluice.sink import Sink

__all__ = ["probe_sinks"]

log = logging.getLogger("sluice.job")


def probe_sinks(job: JobGraph) -> None:
    """Probe every sink of ``job``.

    Raises:
        ConfigError: a sink's output cannot be reached or written (not recoverable): ``sink 'name': ...``
            with the sink's own message, which names the option.
    """
    for node in job.logical.nodes.values():
        if node.kind is not NodeKind.SINK:
            continue
        sink: Sink[Any] = node.spec
        try:
            sink.probe()
        except Exception as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            raise ConfigError(f"sink {node.name!r}: {text}") from exc
