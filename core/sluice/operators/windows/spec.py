"""What a windowed aggregation is made of: window assigners (tumbling, sliding, session) and aggregations
named as in Flink SQL / Spark / Quix Streams (``count``, ``sum``, ``min``, ``max``, ``mean``, ``first``,
``last``, ``count_distinct``, and :func:`agg` for a user function over Arrow arrays).

Durations are :mod:`sluice.durations`: a string such as ``"500ms"``, ``"30 s"``, ``"1m"``, ``"2 h"``, a
:class:`datetime.timedelta`, or a bare number of **seconds** (``Tumbling(60)`` is one minute).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sluice.durations import Duration, Sign
from sluice.durations import to_ms as _to_ms
from sluice.errors import ConfigError

__all__ = [
    "Agg",
    "Duration",
    "Session",
    "Sliding",
    "Tumbling",
    "WindowAssigner",
    "agg",
    "count",
    "count_distinct",
    "first",
    "last",
    "max",
    "mean",
    "min",
    "sum",
    "to_ms",
]

def to_ms(value: Duration, what: str, *, sign: Sign = "non-negative") -> int:
    """``value`` in whole milliseconds (:func:`sluice.durations.to_ms`; one ConfigError line naming ``what``)."""
    return _to_ms(value, what, sign=sign)


class WindowAssigner:
    """Which windows a record belongs to (see :class:`Tumbling`, :class:`Sliding`, :class:`Session`)."""

    kind = ""

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, init=False)
class Tumbling(WindowAssigner):
    """Fixed-size, non-overlapping windows ``[start, start + size)``, aligned to the epoch plus ``offset``
    (Flink's ``TumblingEventTimeWindows``, Spark's ``window(ts, "1 minute")``, Quix's ``tumbling_window``)."""

    size: int
    offset: int

    kind = "tumbling"

    def __init__(self, size: Duration, offset: Duration = 0) -> None:
        object.__setattr__(self, "size", to_ms(size, "Tumbling(size)", sign="positive"))
        object.__setattr__(self, "offset", to_ms(offset, "Tumbling(offset)"))

    def describe(self) -> str:
        return f"tumbling {self.size} ms"


@dataclass(frozen=True, init=False)
class Sliding(WindowAssigner):
    """Windows of ``size`` starting every ``slide`` (hopping windows): a record belongs to ``size / slide``
    windows (Flink's ``SlidingEventTimeWindows``, Spark's ``window(ts, size, slide)``, Quix's
    ``hopping_window``)."""

    size: int
    slide: int
    offset: int

    kind = "sliding"

    def __init__(self, size: Duration, slide: Duration, offset: Duration = 0) -> None:
        object.__setattr__(self, "size", to_ms(size, "Sliding(size)", sign="positive"))
        object.__setattr__(self, "slide", to_ms(slide, "Sliding(slide)", sign="positive"))
        object.__setattr__(self, "offset", to_ms(offset, "Sliding(offset)"))
        if self.slide <= 0 or self.size <= 0 or self.size % self.slide:
            raise ConfigError(
                f"Sliding(size={size!r}, slide={slide!r}): size and slide must be positive and size a multiple "
                "of slide"
            )

    def describe(self) -> str:
        return f"sliding {self.size} ms every {self.slide} ms"


@dataclass(frozen=True, init=False)
class Session(WindowAssigner):
    """Per key, records closer than ``gap`` to each other form one window ``[first, last + gap)``; windows
    that come to overlap merge (Flink's ``EventTimeSessionWindows``, Spark's ``session_window``)."""

    gap: int

    kind = "session"

    def __init__(self, gap: Duration) -> None:
        object.__setattr__(self, "gap", to_ms(gap, "Session(gap)", sign="positive"))

    def describe(self) -> str:
        return f"session gap {self.gap} ms"


#: aggregation functions by name
FUNCTIONS = ("count", "sum", "min", "max", "mean", "first", "last", "count_distinct", "agg")


@dataclass(frozen=True)
class Agg:
    """One aggregation of a window: ``fn`` over ``column`` (None: count rows), output column ``name``.

    Attributes:
        fn: one of :data:`FUNCTIONS`.
        column: the input column, or None for ``count()``.
        name: the output column.
        udf: for ``agg``: the user function over the window's values (an Arrow array) returning a scalar.
        type: for ``agg``: the Arrow type of its result.
    """

    fn: str
    column: str | None
    name: str
    udf: Callable[[pa.Array], Any] | None = field(default=None, compare=False)
    type: pa.DataType | None = None


def _agg(fn: str, column: str | None, name: str | None) -> Agg:
    if column is not None and (not isinstance(column, str) or not column):
        raise ConfigError(f"{fn}(column): expected a column name, got {column!r}")
    return Agg(fn, column, name or (fn if column is None else f"{fn}_{column}"))


def count(column: str | None = None, *, name: str | None = None) -> Agg:
    """The number of rows (``count()``), or of non-null values of ``column``; output ``count`` /
    ``count_<column>`` unless ``name`` is given."""
    return _agg("count", column, name)


def sum(column: str, *, name: str | None = None) -> Agg:
    """The sum of ``column`` (null if the window has no non-null value); output ``sum_<column>``."""
    return _agg("sum", column, name)


def min(column: str, *, name: str | None = None) -> Agg:
    """The smallest value of ``column``; output ``min_<column>``."""
    return _agg("min", column, name)


def max(column: str, *, name: str | None = None) -> Agg:
    """The largest value of ``column``; output ``max_<column>``."""
    return _agg("max", column, name)


def mean(column: str, *, name: str | None = None) -> Agg:
    """The mean of the non-null values of ``column`` (float64); output ``mean_<column>``."""
    return _agg("mean", column, name)


def first(column: str, *, name: str | None = None) -> Agg:
    """The value of ``column`` in the window's earliest row by event time (ties: the first to arrive);
    output ``first_<column>``."""
    return _agg("first", column, name)


def last(column: str, *, name: str | None = None) -> Agg:
    """The value of ``column`` in the window's latest row by event time (ties: the last to arrive); output
    ``last_<column>``."""
    return _agg("last", column, name)


def count_distinct(column: str, *, name: str | None = None) -> Agg:
    """The number of distinct non-null values of ``column``; output ``count_distinct_<column>``."""
    return _agg("count_distinct", column, name)


def agg(fn: Callable[[pa.Array], Any], column: str, *, name: str, type: pa.DataType) -> Agg:
    """A user aggregation: ``fn(values) -> scalar`` called once per window and key when it fires, with the
    window's values of ``column`` (an Arrow array, in arrival order); the result has Arrow ``type``.

    The values are kept in state until the window fires (as Flink's ``ProcessWindowFunction``): prefer the
    built-in aggregations, which keep one partial value per window and key.
    """
    if not callable(fn):
        raise ConfigError(f"agg(fn): expected a function of an Arrow array, got {fn!r}")
    if not isinstance(type, pa.DataType):
        raise ConfigError(f"agg(type=...): expected a pyarrow type such as pa.float64(), got {type!r}")
    a = _agg("agg", column, name)
    return Agg("agg", a.column, name, fn, type)


def check_aggs(aggs: tuple[Agg, ...], reserved: builtins.list[str]) -> None:
    """Refuse no aggregation, one that is not an :class:`Agg`, and clashing output names (one line)."""
    if not aggs:
        raise ConfigError("aggregate: give at least one aggregation, e.g. aggregate(count(), sum('amount'))")
    names: builtins.list[str] = []
    for a in aggs:
        if not isinstance(a, Agg):
            raise ConfigError(
                f"aggregate: expected aggregations ({', '.join(FUNCTIONS)} from sluice.windows), got {a!r}"
            )
        names.append(a.name)
    dup = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(reserved)))
    if dup:
        raise ConfigError(
            f"aggregate: output column(s) {dup} clash with others; give name=... to tell them apart"
        )
