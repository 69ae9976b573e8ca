"""Streams of a pipeline: :class:`Stream` (transformations, exchanges, sinks) and :class:`KeyedStream`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from sluice.api.dedup_joins import DedupJoinMethods
from sluice.errors import ConfigError, GraphError
from sluice.functions import KeyedProcessFunction
from sluice.graph import LogicalEdge, LogicalGraph, LogicalNode, Partitioning
from sluice.keys import KeySelector, KeySpec
from sluice.operators.keyed import KeyedProcessOperator, ReduceFunction
from sluice.operators.sinks import add_sink
from sluice.operators.stateless import (
    FilterOperator,
    FlatMapOperator,
    MapBatchesOperator,
    MapOperator,
    PassThroughOperator,
)
from sluice.operators.windows.spec import Duration, Session, Sliding, Tumbling, WindowAssigner
from sluice.runtime.upgrades import key_config
from sluice.sink import Sink

if TYPE_CHECKING:
    from sluice.api.windowed import WindowedStream

__all__ = ["KeyedStream", "Stream"]


class GraphBuilder(Protocol):
    """What a stream needs of its pipeline: the graph, and adding a node to it (``Pipeline._add``)."""

    @property
    def graph(self) -> LogicalGraph: ...

    def _add(
        self,
        label: str,
        name: str | None,
        make: Callable[[str], Any],
        parallelism: int | None,
        inputs: list[LogicalEdge],
        **kw: Any,
    ) -> LogicalNode: ...


class Stream(DedupJoinMethods):
    """A stream of record batches produced by one node of a pipeline (optionally one of its side outputs).

    Stateful steps beyond ``key_by(...).process``: ``deduplicate``, ``join_latest`` and ``interval_join``
    (:class:`~sluice.api.dedup_joins.DedupJoinMethods`).

    ``schema`` is the stream's Arrow schema where the job knows it before it runs (a source that declares
    it, then filters, exchanges, unions and operators given ``schema=``); sinks check it at build time.
    """

    def __init__(
        self, pipeline: GraphBuilder, node: LogicalNode, tag: str | None = None, schema: pa.Schema | None = None
    ) -> None:
        self.pipeline = pipeline
        self.node = node
        self.tag = tag
        self.schema = schema

    def _edge(
        self, partitioning: Partitioning = Partitioning.AUTO, key: KeySelector | None = None
    ) -> LogicalEdge:
        return LogicalEdge(self.node.id, partitioning, key, self.tag)

    def _then(
        self,
        label: str,
        name: str | None,
        make: Callable[[str], Any],
        parallelism: int | None,
        edge: LogicalEdge | None = None,
        schema: pa.Schema | None = None,
        **node_kw: Any,
    ) -> Stream:
        node = self.pipeline._add(label, name, make, parallelism, [edge or self._edge()], **node_kw)
        return Stream(self.pipeline, node, schema=schema)

    def map_batches(
        self,
        fn: Callable[[pa.RecordBatch], Any],
        *,
        name: str | None = None,
        parallelism: int | None = None,
        schema: pa.Schema | None = None,
    ) -> Stream:
        """Apply ``fn(batch) -> batch | table | batches | None`` to every batch (vectorized); ``schema``
        declares what ``fn`` returns, so later steps (e.g. ``key_by``) can check their columns at build time."""
        return self._then("map_batches", name, lambda n: MapBatchesOperator(n, fn), parallelism, schema=schema)

    def filter(
        self,
        predicate: pc.Expression | Callable[[pa.RecordBatch], Any],
        *,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Keep rows where ``predicate`` (a ``pyarrow.compute`` expression, or ``fn(batch) -> mask``) holds."""
        if not isinstance(predicate, pc.Expression) and not callable(predicate):
            raise ConfigError("filter: predicate must be a pyarrow.compute.Expression or fn(batch) -> mask")
        return self._then("filter", name, lambda n: FilterOperator(n, predicate), parallelism, schema=self.schema)

    def map(
        self,
        fn: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        schema: pa.Schema | None = None,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Apply ``fn(row) -> row`` to every record. **Slow**: one Python call per record; prefer map_batches."""
        return self._then("map", name, lambda n: MapOperator(n, fn, schema), parallelism, schema=schema)

    def flat_map(
        self,
        fn: Callable[[dict[str, Any]], Iterable[dict[str, Any]]],
        *,
        schema: pa.Schema | None = None,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Apply ``fn(row) -> rows`` to every record. **Slow**: one Python call per record."""
        return self._then("flat_map", name, lambda n: FlatMapOperator(n, fn, schema), parallelism, schema=schema)

    def key_by(self, key: KeySpec) -> KeyedStream:
        """Partition by key (a column, columns, or ``fn(batch) -> array``) for keyed state.

        Key columns are int, float, bool, string, binary, date or timestamp columns (keyed state stores keys
        in a stable encoding); another type is refused here when the stream's schema is known.
        """
        selector = KeySelector(key)
        selector.check_state_key(self.schema)
        return KeyedStream(self, selector)

    def rebalance(self, *, parallelism: int | None = None) -> Stream:
        """Spread batches round-robin over the next operator's subtasks."""
        return self._then(
            "rebalance", None, PassThroughOperator, parallelism, self._edge(Partitioning.REBALANCE), self.schema
        )

    def broadcast(self, *, parallelism: int | None = None) -> Stream:
        """Send every batch to every subtask of the next operator."""
        return self._then(
            "broadcast", None, PassThroughOperator, parallelism, self._edge(Partitioning.BROADCAST), self.schema
        )

    def union(self, *others: Stream, name: str | None = None, parallelism: int | None = None) -> Stream:
        """Merge this stream with ``others`` (same schema expected)."""
        for o in others:
            if o.pipeline is not self.pipeline:
                raise GraphError("union: all streams must belong to the same pipeline")
        edges = [s._edge() for s in (self, *others)]
        node = self.pipeline._add("union", name, PassThroughOperator, parallelism, edges)
        same = all(o.schema is not None and o.schema.equals(self.schema) for o in others)
        return Stream(self.pipeline, node, schema=self.schema if same else None)

    def uid(self, uid: str) -> Stream:
        """Name this operator's state in checkpoints (default: its name), so renaming it keeps its state.

        As Flink's ``uid()``: set it on stateful operators of long-running jobs. A restore fails when the
        checkpoint holds state for a uid the job does not have, unless ``allow_non_restored_state=True``.
        """
        self.pipeline.graph.set_uid(self.node, uid)
        return self

    def side_output(self, tag: str) -> Stream:
        """The side output ``tag`` of this stream's operator (e.g. a source's dead letters)."""
        return Stream(self.pipeline, self.node, tag)

    def sink(
        self,
        sink: Sink[Any],
        *,
        name: str | None = None,
        parallelism: int | None = None,
        uid: str | None = None,
    ) -> None:
        """Write this stream to ``sink`` with two-phase commit (``uid``: see :meth:`uid`).

        A sink that ``compacts`` becomes two operators: ``<name>.writer`` and ``<name>`` (the compactor and
        committer), joined by an exchange keyed by the compactor's key and never unaligned. A sink that needs
        each key's records in one writer (:meth:`~sluice.sink.Sink.input_key_columns`: an upsert of plain
        rows) reads the stream through a hash exchange on those columns.
        """
        if not isinstance(sink, Sink):
            raise ConfigError(f"sink: expected a sluice Sink, got {type(sink).__name__}")
        sink.validate()
        if self.schema is not None:
            sink.validate_schema(self.schema)
        p = self.pipeline
        key = sink.input_key_columns(self.schema)
        edge = self._edge(Partitioning.HASH, KeySelector(key)) if key else self._edge()
        # an unnamed sink is named after its kind; a second one of that kind gets "-2" (as other steps)
        name = name if name is not None else p._fresh(sink.name)
        add_sink(p.graph, p._add, sink, edge, name, parallelism, uid)


class KeyedStream:
    """A stream partitioned by key: follow with ``process``, ``reduce`` or ``window(...).aggregate(...)``."""

    def __init__(self, stream: Stream, key: KeySelector) -> None:
        self.stream = stream
        self.key = key

    def process(
        self,
        fn: KeyedProcessFunction,
        *,
        schema: pa.Schema | None = None,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Run a KeyedProcessFunction with keyed value/list/map state and timers."""
        if not isinstance(fn, KeyedProcessFunction):
            raise ConfigError("process: fn must be a KeyedProcessFunction")
        key = self.key
        return self.stream._then(
            "process",
            name or type(fn).__name__,
            lambda n: KeyedProcessOperator(n, key, fn, schema),
            parallelism,
            self.stream._edge(Partitioning.HASH, key),
            schema,
            key=key,
            state_config={"operator": "process", **key_config(key, self.stream.schema)},
        )

    def reduce(
        self,
        fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
        *,
        name: str | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """Running reduction per key, ``fn(acc, row) -> acc``; emits the updated value for every input row."""
        return self.process(ReduceFunction(fn), name=name or "reduce", parallelism=parallelism)

    def window(
        self,
        assigner: WindowAssigner,
        *,
        time: str | None = None,
        processing_time: bool = False,
        allowed_lateness: Duration = 0,
    ) -> WindowedStream:
        """Cut each key's records into windows (``Tumbling``, ``Sliding`` or ``Session`` from
        :mod:`sluice.windows`) by the event-time column ``time`` (int64 ms or a timestamp; windows close as
        the watermark passes their end) or by ``processing_time``; follow with ``.aggregate(...)``.

        ``allowed_lateness``: how long after a window's end records still update its result (docs/windows.md).
        """
        from sluice.api.windowed import window_of

        return window_of(self, assigner, time, processing_time, allowed_lateness)

    def tumbling_window(self, size: Duration, *, time: str | None = None, processing_time: bool = False,
                        allowed_lateness: Duration = 0) -> WindowedStream:
        """``window(Tumbling(size), ...)``."""
        return self.window(Tumbling(size), time=time, processing_time=processing_time, allowed_lateness=allowed_lateness)

    def sliding_window(self, size: Duration, slide: Duration, *, time: str | None = None,
                       processing_time: bool = False, allowed_lateness: Duration = 0) -> WindowedStream:
        """``window(Sliding(size, slide), ...)`` (hopping windows)."""
        return self.window(Sliding(size, slide), time=time, processing_time=processing_time,
                           allowed_lateness=allowed_lateness)

    def session_window(self, gap: Duration, *, time: str | None = None, processing_time: bool = False,
                       allowed_lateness: Duration = 0) -> WindowedStream:
        """``window(Session(gap), ...)``."""
        return self.window(Session(gap), time=time, processing_time=processing_time, allowed_lateness=allowed_lateness)
