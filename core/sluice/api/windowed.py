"""Windowed streams: ``keyed.window(Tumbling("1m"), time="ts").aggregate(count(), sum("amount"))``.

The operator is :class:`sluice.operators.windows.operator.WindowOperator` (docs/windows.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice.errors import ConfigError
from sluice.graph import Partitioning
from sluice.operators.windows.operator import WindowOperator
from sluice.operators.windows.spec import Agg, Duration, WindowAssigner, check_aggs, to_ms
from sluice.runtime.upgrades import key_config

if TYPE_CHECKING:
    from sluice.api.stream import KeyedStream, Stream

__all__ = ["WindowedStream", "window_of"]


class WindowedStream:
    """A keyed stream cut into windows: follow with :meth:`aggregate`."""

    def __init__(
        self, keyed: KeyedStream, assigner: WindowAssigner, time: str | None, allowed_lateness: int
    ) -> None:
        self.keyed = keyed
        self.assigner = assigner
        self.time = time
        self.allowed_lateness = allowed_lateness

    def aggregate(
        self,
        *aggs: Agg,
        name: str | None = None,
        parallelism: int | None = None,
        max_pending_rows: int = 200_000,
    ) -> Stream:
        """One row per key and window when the window closes: the key columns, ``window_start``,
        ``window_end`` and one column per aggregation (``count()``, ``sum("x")``, ... from
        :mod:`sluice.windows`); with ``allowed_lateness`` also ``revision`` (0 for the first result, then 1,
        2, ... for updates). Records too late for every window go to ``.side_output("late")``.

        Args:
            aggs: the aggregations.
            name: the operator's name (default ``window``); its state's identity unless ``uid`` is set.
            parallelism: the operator's parallelism.
            max_pending_rows: partial aggregates kept in memory between flushes into the state backend.
        """
        names = self.keyed.key._columns or ["key"]
        check_aggs(aggs, [*names, "window_start", "window_end", "revision"])
        if not isinstance(max_pending_rows, int) or max_pending_rows < 1:
            raise ConfigError(
                f"aggregate(max_pending_rows): expected an integer >= 1, got {max_pending_rows!r}"
            )
        schema = self.keyed.stream.schema
        if schema is not None:
            for col in [self.time, *(a.column for a in aggs)]:
                if col is not None and schema.get_field_index(col) < 0:
                    raise ConfigError(
                        f"window: column {col!r} is not in the stream (columns: {schema.names})"
                    )
        key, assigner, time, lateness = self.keyed.key, self.assigner, self.time, self.allowed_lateness
        stream = self.keyed.stream
        config = {
            "operator": "window",
            "window": assigner.kind,
            **{f"{f}_ms": getattr(assigner, f) for f in ("size", "slide", "offset", "gap") if hasattr(assigner, f)},
            "time": "event" if time is not None else "processing",
            "allowed_lateness_ms": lateness,
            "aggregations": [[a.fn, a.column, a.name] for a in aggs],
            **key_config(key, schema),
        }
        return stream._then(
            "window",
            name or "window",
            lambda n: WindowOperator(n, key, assigner, aggs, time, lateness, max_pending_rows),
            parallelism,
            stream._edge(Partitioning.HASH, key),
            None,
            key=key,
            state_config=config,
        )


def window_of(
    keyed: KeyedStream,
    assigner: WindowAssigner,
    time: str | None,
    processing_time: bool,
    allowed_lateness: Duration,
) -> WindowedStream:
    """Check a window's options (one-line errors naming the option) and make its :class:`WindowedStream`."""
    if not isinstance(assigner, WindowAssigner):
        raise ConfigError(
            f"window: expected Tumbling(...), Sliding(...) or Session(...) from sluice.windows, got {assigner!r}"
        )
    if processing_time and time is not None:
        raise ConfigError("window: give either time='<event-time column>' or processing_time=True, not both")
    if not processing_time and (not isinstance(time, str) or not time):
        raise ConfigError(
            "window: name the event-time column with time='<column>' (int64 ms or a timestamp), or use "
            "processing_time=True"
        )
    lateness = to_ms(allowed_lateness, "window(allowed_lateness)")
    if processing_time and lateness:
        raise ConfigError("window: allowed_lateness applies to event time only (processing_time=True)")
    return WindowedStream(keyed, assigner, time, lateness)
