"""``Stream.deduplicate``, ``Stream.join_latest`` and ``Stream.interval_join`` (docs/dedup_joins.md).

A mixin of :class:`~sluice.api.stream.Stream`: each method checks its options when the job is built (one
line naming the option and what is allowed) and adds a keyed operator of :mod:`sluice.operators.dedup` or
:mod:`sluice.operators.joins`; a join is one operator with two inputs, each hash-partitioned by its own key
columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

import pyarrow as pa

from sluice.durations import Duration, to_ms, to_seconds
from sluice.errors import ConfigError, GraphError
from sluice.graph import LogicalEdge, Partitioning
from sluice.keys import KeySelector
from sluice.operators.dedup import DeduplicateOperator
from sluice.operators.joins import IntervalJoinOperator, LatestJoinOperator
from sluice.operators.joins.common import right_names
from sluice.runtime.upgrades import key_config

__all__ = ["DedupJoinMethods"]

def _columns(option: str, value: str | Sequence[str]) -> list[str]:
    cols = [value] if isinstance(value, str) else list(value) if isinstance(value, Sequence) else []
    if not cols or not all(isinstance(c, str) and c for c in cols):
        raise ConfigError(f"{option}: expected a column name or a list of column names, got {value!r}")
    return cols


def _check(option: str, schema: pa.Schema | None, cols: Sequence[str]) -> None:
    if schema is None:
        return
    for c in cols:
        if c not in schema.names:
            raise ConfigError(f"{option}: column {c!r} is not in the stream (columns: {', '.join(schema.names)})")


def _choice(option: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{option}: {value!r} is not allowed (allowed: {', '.join(map(repr, allowed))})")


class DedupJoinMethods:
    """Deduplication and joins of a :class:`~sluice.api.stream.Stream`."""

    if TYPE_CHECKING:
        pipeline: Any
        schema: pa.Schema | None

        def _edge(self, partitioning: Partitioning = ..., key: KeySelector | None = None) -> LogicalEdge: ...
        def _then(
            self,
            label: str,
            name: str | None,
            make: Callable[[str], Any],
            parallelism: int | None,
            edge: LogicalEdge | None = None,
            schema: pa.Schema | None = None,
            **node_kw: Any,
        ) -> Self: ...

    def deduplicate(
        self,
        keys: str | Sequence[str],
        *,
        within: Duration,
        event_time: str | None = None,
        keep: str = "first",
        order_by: str | None = None,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Self:
        """Drop records whose key was seen within ``within`` (Spark's ``dropDuplicatesWithinWatermark``,
        Flink SQL's deduplication), exactly once through failures.

        A key's first record opens a horizon ``[t, t + within)`` (``t``: its ``event_time`` column, or the
        processing time without one); the key's records within it are duplicates. ``keep="first"`` emits
        the record that opened the horizon at once; ``keep="last"`` emits, per horizon, the record with the
        greatest ``order_by`` value (the last to arrive on a tie) when the horizon closes (the watermark, or
        processing time, reaches its end; or the key's next horizon opens; or a bounded input ends).

        Args:
            keys: the key column(s).
            within: the horizon: ``"1 h"``, a timedelta or a number of seconds (:mod:`sluice.durations`).
            event_time: the event-time column (timestamp, or int milliseconds); None: processing time.
            keep: ``"first"`` or ``"last"``.
            order_by: with ``keep="last"``: the column whose greatest value wins.
            name: the operator's name (its state's identity).
            parallelism: the operator's parallelism.
        """
        cols = _columns("deduplicate: keys", keys)
        within_ms = to_ms(within, "deduplicate: within")
        _choice("deduplicate: keep", keep, ("first", "last"))
        if keep == "last" and not order_by:
            raise ConfigError("deduplicate: keep='last' needs order_by=<column> (the greatest value is kept)")
        if keep == "first" and order_by:
            raise ConfigError("deduplicate: order_by is only used with keep='last'")
        _check("deduplicate: keys", self.schema, cols)
        _check("deduplicate: event_time", self.schema, [event_time] if event_time else [])
        _check("deduplicate: order_by", self.schema, [order_by] if order_by else [])
        key = KeySelector(cols)
        key.check_state_key(self.schema)
        schema, keep_ = self.schema, keep

        def make(n: str) -> DeduplicateOperator:
            return DeduplicateOperator(n, key, within_ms, event_time, keep_, order_by, schema)  # type: ignore[arg-type]

        edge = self._edge(Partitioning.HASH, key)
        config = {
            "operator": "deduplicate", "within_ms": within_ms, "keep": keep, "order_by": order_by,
            "time": "event" if event_time else "processing", **key_config(key, self.schema),
        }  # fmt: skip
        return self._then(
            "deduplicate", name, make, parallelism, edge, schema, key=key, state_distribution="union",
            state_config=config,
        )  # fmt: skip

    def _two_inputs(self, other: Any, label: str, on: Any, left_on: Any, right_on: Any) -> tuple[list[str], list[str]]:
        if not isinstance(other, DedupJoinMethods) or other.pipeline is not self.pipeline:
            raise GraphError(f"{label}: the other stream must be a stream of the same pipeline")
        if on is not None and (left_on is not None or right_on is not None):
            raise ConfigError(f"{label}: give either on= or left_on= and right_on=, not both")
        if on is not None:
            lk = rk = _columns(f"{label}: on", on)
        elif left_on is not None and right_on is not None:
            lk, rk = _columns(f"{label}: left_on", left_on), _columns(f"{label}: right_on", right_on)
            if len(lk) != len(rk):
                raise ConfigError(f"{label}: left_on and right_on must name as many columns ({lk} vs {rk})")
        else:
            raise ConfigError(f"{label}: name the key columns with on= (or left_on= and right_on=)")
        _check(f"{label}: left key", self.schema, lk)
        _check(f"{label}: right key", other.schema, rk)
        if self.schema is not None and other.schema is not None:
            for a, b in zip(lk, rk, strict=True):
                ta, tb = self.schema.field(a).type, other.schema.field(b).type
                if ta != tb:
                    raise ConfigError(f"{label}: key columns {a!r} ({ta}) and {b!r} ({tb}) must have the same type")
        return lk, rk

    def _join_node(self, other: Any, label: str, name: str | None, make: Callable[[str], Any], parallelism: int | None,
                   lk: list[str], rk: list[str], schema: pa.Schema | None, config: dict[str, Any]) -> Self:
        left, right = KeySelector(lk), KeySelector(rk)
        left.check_state_key(self.schema)
        right.check_state_key(other.schema)
        edges = [self._edge(Partitioning.HASH, left), other._edge(Partitioning.HASH, right)]
        config = {"operator": label, **config, **key_config(left, self.schema), "right_key": rk}
        # the buffers in operator state: every subtask reads all on restore and keeps its key groups' rows
        node = self.pipeline._add(
            label, name, make, parallelism, edges, key=left, state_distribution="union", state_config=config
        )
        return type(self)(self.pipeline, node, schema=schema)  # type: ignore[call-arg]

    def join_latest(
        self,
        table: Any,
        *,
        on: str | Sequence[str] | None = None,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
        how: str = "inner",
        event_time: str | tuple[str, str] | None = None,
        table_idle_timeout: Duration | None = "5 s",
        suffix: str = "_right",
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Self:
        """Enrich each record with the latest row of its key in ``table`` (a stream of upserts, e.g. a
        compacted topic): Kafka Streams' KStream-KTable join, Flink's temporal join. The table is held in
        keyed state (hashmap or RocksDB); a tombstone (``_sluice_op`` DELETE, or all non-key columns null)
        deletes its key's row.

        Args:
            table: the table's stream (same pipeline).
            on: key column(s) of both sides; or ``left_on`` and ``right_on``.
            how: ``"inner"`` (records without a table row are dropped) or ``"left"`` (kept, nulls).
            event_time: the time column of both sides (or ``(left, right)``): each record joins the row
                that was latest at its own time, once the watermark passes it (deterministic); None:
                processing time (the row latest when the record is processed).
            table_idle_timeout: event time: how long the table side may deliver nothing (a quiet topic)
                before it stops holding the watermark back, as Flink's source idleness; the records then
                join the table as it is, and a table row that arrives later with an earlier time is applied
                from then on. None: wait for the table's watermark (exact, but a quiet table stops the join).
            suffix: appended to a table column whose name the stream has too.
        """
        lk, rk = self._two_inputs(table, "join_latest", on, left_on, right_on)
        _choice("join_latest: how", how, ("inner", "left"))
        idle = None if table_idle_timeout is None else to_seconds(table_idle_timeout, "join_latest: table_idle_timeout")
        lt, rt = (event_time, event_time) if isinstance(event_time, str) or event_time is None else event_time
        _check("join_latest: event_time", self.schema, [lt] if lt else [])
        _check("join_latest: event_time", table.schema, [rt] if rt else [])
        if how == "left" and table.schema is None:
            raise ConfigError(
                "join_latest: how='left' needs the table stream's schema (declare it, e.g. map_batches(schema=...))"
            )
        out = None
        if self.schema is not None and table.schema is not None:
            from sluice.changes import OP, ORDER

            names = right_names(self.schema.names, table.schema.names, [*rk, OP, ORDER], suffix)
            out = pa.schema([*self.schema, *(table.schema.field(c).with_name(n) for c, n in names.items())])
        rschema = table.schema

        def make(n: str) -> LatestJoinOperator:
            return LatestJoinOperator(n, lk, rk, how, lt, rt, rschema, suffix, idle)  # type: ignore[arg-type]

        config = {"time": "event" if lt else "processing"}
        return self._join_node(table, "join_latest", name, make, parallelism, lk, rk, out, config)

    def interval_join(
        self,
        other: Any,
        *,
        between: tuple[Duration, Duration],
        on: str | Sequence[str] | None = None,
        left_on: str | Sequence[str] | None = None,
        right_on: str | Sequence[str] | None = None,
        event_time: str | tuple[str, str] = "ts",
        suffix: str = "_right",
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Self:
        """Join records of two streams with the same key whose event times are close, as Flink's
        ``a.intervalJoin(b).between(lower, upper)``: a record ``a`` of this stream and ``b`` of ``other`` pair
        when ``a.t + lower <= b.t <= a.t + upper`` (``between=(lower, upper)``). ``between=("0 s", "1 min")``:
        ``b`` up to a minute after ``a``; ``between=("-10 s", "10 s")``: within ten seconds either way. Each
        side's records are buffered until the watermark passes their bound; late records are dropped.

        Args:
            other: the other stream (same pipeline).
            between: ``(lower, upper)``: durations (:mod:`sluice.durations`; negative: before), ``lower <=
                upper``.
            on: key column(s) of both sides; or ``left_on`` and ``right_on``.
            event_time: the event-time column of both sides (or ``(left, right)``).
            suffix: appended to a column of ``other`` whose name this stream has too.
        """
        lk, rk = self._two_inputs(other, "interval_join", on, left_on, right_on)
        if not isinstance(between, tuple | list) or len(between) != 2:
            raise ConfigError(
                "interval_join: between: expected (lower, upper): other.t - self.t within [lower, upper], as "
                f"Flink's between(lower, upper), e.g. ('-10 s', '1 min'); got {between!r}"
            )
        lower = to_ms(between[0], "interval_join: between lower", sign="any")
        upper = to_ms(between[1], "interval_join: between upper", sign="any")
        if lower > upper:
            raise ConfigError(
                f"interval_join: between: lower {between[0]!r} is after upper {between[1]!r} (other.t - self.t "
                "must lie within [lower, upper], as Flink's between(lower, upper))"
            )
        lt, rt = (event_time, event_time) if isinstance(event_time, str) else event_time
        _check("interval_join: event_time", self.schema, [lt])
        _check("interval_join: event_time", other.schema, [rt])
        out = None
        if self.schema is not None and other.schema is not None:
            names = right_names(self.schema.names, other.schema.names, rk, suffix)
            out = pa.schema([*self.schema, *(other.schema.field(c).with_name(n) for c, n in names.items())])

        def make(n: str) -> IntervalJoinOperator:
            return IntervalJoinOperator(n, lk, rk, lt, rt, lower, upper, suffix)

        config = {"lower_ms": lower, "upper_ms": upper}
        return self._join_node(other, "interval_join", name, make, parallelism, lk, rk, out, config)
