"""Windowed aggregation on keyed streams: window assigners and aggregations (docs/windows.md).

from sluice.windows import Tumbling, count, sum, max

stream.key_by("user").window(Tumbling("1m"), time="ts").aggregate(count(), sum("amount"), max("amount"))
"""

from __future__ import annotations

from sluice.api.windowed import WindowedStream
from sluice.operators.windows.operator import LATE
from sluice.operators.windows.spec import (
    Agg,
    Session,
    Sliding,
    Tumbling,
    WindowAssigner,
    agg,
    count,
    count_distinct,
    first,
    last,
    max,
    mean,
    min,
    sum,
)

__all__ = [
    "LATE",
    "Agg",
    "Session",
    "Sliding",
    "Tumbling",
    "WindowAssigner",
    "WindowedStream",
    "agg",
    "count",
    "count_distinct",
    "first",
    "last",
    "max",
    "mean",
    "min",
    "sum",
]
