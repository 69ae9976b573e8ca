"""Kafka lag and fetch rates of a reader, from librdkafka's statistics (``statistics.interval.ms``).

Once a second librdkafka hands the consumer's statistics (JSON) to :meth:`ReaderMetrics.on_stats`, on the
thread that polls the consumer; from them and the reader's positions (the next offset each split emits,
so records fetched ahead but not emitted count as lag) it sets, through the reader's context:

* gauge ``kafka_lag_records``: the records between the reader's positions and the partitions' last
  stable offsets (high watermarks when no stable offset is known), over the reader's live splits;
* counters ``kafka_fetched_records`` and ``kafka_fetched_bytes``: what the consumer fetched.

On the control endpoint they are ``sluice_kafka_lag_records``, ``sluice_kafka_fetched_records_total``
and ``sluice_kafka_fetched_bytes_total``. A ``stats_cb`` or ``statistics.interval.ms`` of your own in
``consumer_config`` replaces these (set ``statistics.interval.ms`` to 0 to turn them off).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from sluice.source import ReaderContext

__all__ = ["STATS_INTERVAL_MS", "ReaderMetrics"]

STATS_INTERVAL_MS = 1000


class ReaderMetrics:
    """Turns one consumer's statistics into the reader's lag gauge and fetch counters.

    Args:
        ctx: The reader's context (where the gauge and counters go).
        positions: The reader's live splits: (topic, partition) -> the next offset it emits.
        on_brokers: Called with each report's ``brokers`` (their connection states).
    """

    def __init__(
        self,
        ctx: ReaderContext,
        positions: Callable[[], Mapping[tuple[str, int], int]],
        on_brokers: Callable[[Mapping[str, Any] | None], None] | None = None,
    ) -> None:
        self._ctx = ctx
        self._positions = positions
        self._on_brokers = on_brokers
        self._records = 0
        self._bytes = 0

    def configure(self, conf: dict[str, Any]) -> None:
        """Ask librdkafka for statistics once a second, delivered to :meth:`on_stats` (unless ``conf``
        already sets either)."""
        if "stats_cb" not in conf:
            conf.setdefault("statistics.interval.ms", STATS_INTERVAL_MS)
            conf["stats_cb"] = self.on_stats

    def on_stats(self, raw: str) -> None:
        """librdkafka's statistics JSON: set the lag gauge, count what was fetched since the last call."""
        try:
            data = json.loads(raw)
        except ValueError:
            return
        if self._on_brokers is not None:
            self._on_brokers(data.get("brokers"))
        positions = self._positions()
        lag, known = 0, False
        for topic, t in (data.get("topics") or {}).items():
            for p, st in (t.get("partitions") or {}).items():
                pos = positions.get((topic, int(p))) if p.lstrip("-").isdigit() else None
                if pos is None:
                    continue  # the internal partition -1, or one this reader does not read (any more)
                end = st.get("ls_offset", -1)
                end = end if isinstance(end, int) and end >= 0 else st.get("hi_offset", -1)
                if isinstance(end, int) and end >= 0:
                    lag += max(0, end - pos)
                    known = True
        gauge = getattr(self._ctx, "gauge", None)
        if known and gauge is not None:
            gauge("kafka_lag_records", float(lag))
        records, nbytes = int(data.get("rxmsgs", 0)), int(data.get("rxmsg_bytes", 0))
        if records > self._records:
            self._ctx.metric("kafka_fetched_records", records - self._records)
        if nbytes > self._bytes:
            self._ctx.metric("kafka_fetched_bytes", nbytes - self._bytes)
        self._records, self._bytes = max(records, self._records), max(nbytes, self._bytes)
