"""The public API to declare a job: ``Pipeline`` with sources, streams and sinks.

Example::

    p = Pipeline("orders", checkpoint=CheckpointConfig(interval=1.0, storage="/tmp/chk"))
    orders = p.source(GeneratorSource(...))
    totals = orders.filter(pc.field("amount") > 0).key_by("customer").process(RunningTotal())
    totals.sink(FileSink("/data/totals", format="parquet"))
    p.run(runtime="local")
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from sluice.client import JobClient
from sluice.config import CheckpointConfig, FixedDelayRestart, RestartStrategy, validated
from sluice.errors import ConfigError, GraphError
from sluice.functions import KeyedProcessFunction
from sluice.graph import (
    JobGraph,
    LogicalEdge,
    LogicalGraph,
    LogicalNode,
    NodeKind,
    Partitioning,
    build_job_graph,
)
from sluice.keys import KeySelector, KeySpec
from sluice.runtime.fault_hook import NO_FAULTS, FaultHook
from sluice.runtime.job import JobConfig, JobResult
from sluice.runtime.operators import (
    FilterOperator,
    FlatMapOperator,
    KeyedProcessOperator,
    MapBatchesOperator,
    MapOperator,
    PassThroughOperator,
    ReduceFunction,
)
from sluice.runtime.sink_operator import SinkOperator, SinkWriterOperator
from sluice.sink import Sink
from sluice.source import Source

__all__ = ["JobClient", "KeyedStream", "Pipeline", "Stream"]

RUNTIMES = ("local", "spark")
#: where ``Pipeline.start`` serves the control endpoint unless told otherwise: loopback, a free port
DEFAULT_CONTROL_ENDPOINT = "127.0.0.1:0"


class Stream:
    """A stream of record batches produced by one node of a pipeline (optionally one of its side outputs).

    ``schema`` is the stream's Arrow schema where the job knows it before it runs (a source that declares
    it, then filters, exchanges, unions and operators given ``schema=``); sinks check it at build time.
    """

    def __init__(
        self, pipeline: Pipeline, node: LogicalNode, tag: str | None = None, schema: pa.Schema | None = None
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
        self, fn: Callable[[pa.RecordBatch], Any], *, name: str | None = None, parallelism: int | None = None
    ) -> Stream:
        """Apply ``fn(batch) -> batch | table | batches | None`` to every batch (vectorized)."""
        return self._then("map_batches", name, lambda n: MapBatchesOperator(n, fn), parallelism)

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
        """Partition by key (a column, columns, or ``fn(batch) -> array``) for keyed state."""
        return KeyedStream(self, KeySelector(key))

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
        if not isinstance(uid, str) or not uid.strip():
            raise ConfigError(f"uid: must be a non-empty string (got {uid!r})")
        taken = {n.uid: n.name for n in self.pipeline.graph.nodes.values() if n is not self.node}
        if uid in taken:
            raise GraphError(f"uid {uid!r} is already used by operator {taken[uid]!r}: uids must be unique")
        self.node.explicit_uid = uid
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
        committer), joined by an exchange keyed by the compactor's key and never unaligned.
        """
        if not isinstance(sink, Sink):
            raise ConfigError(f"sink: expected a sluice Sink, got {type(sink).__name__}")
        sink.validate()
        if self.schema is not None:
            sink.validate_schema(self.schema)
        edge = self._edge()
        if sink.compacts:
            writer = self._then(
                "sink-writer", f"{name or sink.name}.writer", lambda n: SinkWriterOperator(n, sink), parallelism
            )
            if uid is not None:
                writer.uid(f"{uid}.writer")
            edge = LogicalEdge(writer.node.id, Partitioning.HASH, KeySelector("key"), aligned=True)
        node = self.pipeline._add(
            "sink",
            name or sink.name,
            lambda n: SinkOperator(n, sink, collect=sink.compacts),
            parallelism,
            [edge],
            kind=NodeKind.SINK,
            spec=sink,
        )
        if uid is not None:
            Stream(self.pipeline, node).uid(uid)


class KeyedStream:
    """A stream partitioned by key: follow with ``process`` or ``reduce``."""

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
            state_distribution="union",
            key=key,
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


def _job_id(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "job"


class Pipeline:
    """A job: sources, the streams derived from them, and sinks.

    Args:
        name: the job's name; also its job id in checkpoint storage, so a re-run resumes from the latest
            completed checkpoint of the same name (``restore="none"`` to start fresh).
        parallelism: default parallelism of operators.
        max_parallelism: number of key groups (upper bound for any operator's parallelism; fixed for the
            life of the job's state).
        checkpoint: a CheckpointConfig (or dict of its options).
        restart: restart strategy (FixedDelayRestart, ExponentialBackoffRestart, FailureRateRestart, NoRestart).
        buffers_per_channel: credits (and output queue slots) per channel: bounds memory under backpressure.
        max_batch_rows: split larger batches so one batch's processing (and a barrier's wait) is bounded;
            0 = never split.
        metrics: count the tasks' built-in metrics (records and bytes in and out, busy and backpressured
            time, per batch: cheap, see docs/benchmarks.md); False only to measure what they cost.
    """

    def __init__(
        self,
        name: str,
        *,
        parallelism: int = 1,
        max_parallelism: int = 128,
        checkpoint: CheckpointConfig | dict[str, Any] | None = None,
        restart: RestartStrategy | None = None,
        buffers_per_channel: int = 4,
        max_batch_rows: int = 0,
        metrics: bool = True,
    ) -> None:
        if not isinstance(parallelism, int) or parallelism < 1:
            raise ConfigError(f"Pipeline: parallelism must be an integer >= 1 (got {parallelism!r})")
        if not isinstance(max_parallelism, int) or not 1 <= max_parallelism <= 32768:
            raise ConfigError(
                f"Pipeline: max_parallelism must be an integer in 1..32768 (got {max_parallelism!r})"
            )
        if not isinstance(buffers_per_channel, int) or buffers_per_channel < 1:
            raise ConfigError(
                f"Pipeline: buffers_per_channel must be an integer >= 1 (got {buffers_per_channel!r})"
            )
        if not isinstance(max_batch_rows, int) or max_batch_rows < 0:
            raise ConfigError(f"Pipeline: max_batch_rows must be an integer >= 0 (got {max_batch_rows!r})")
        if restart is not None and not isinstance(restart, RestartStrategy):
            raise ConfigError(
                "Pipeline: restart must be a RestartStrategy (FixedDelayRestart, "
                "ExponentialBackoffRestart, FailureRateRestart, NoRestart)"
            )
        self.name = name
        self.checkpoint: CheckpointConfig = (
            CheckpointConfig()
            if checkpoint is None
            else validated(CheckpointConfig, checkpoint, "checkpoint")
        )
        self.restart = restart or FixedDelayRestart(attempts=3, delay=1.0)
        self.buffers_per_channel = buffers_per_channel
        self.max_batch_rows = max_batch_rows
        self.metrics = bool(metrics)
        self.graph = LogicalGraph(max_parallelism=max_parallelism, default_parallelism=parallelism)
        self._ids = itertools.count()
        self._names: dict[str, int] = {}

    # -- building --------------------------------------------------------------------------------------
    def _unique(self, base: str) -> str:
        n = self._names.get(base, 0)
        self._names[base] = n + 1
        return base if n == 0 else f"{base}-{n + 1}"

    def _add(
        self,
        label: str,
        name: str | None,
        make: Callable[[str], Any],
        parallelism: int | None,
        inputs: list[LogicalEdge],
        **kw: Any,
    ) -> LogicalNode:
        if parallelism is not None and (not isinstance(parallelism, int) or parallelism < 1):
            raise ConfigError(f"{name or label}: parallelism must be an integer >= 1 (got {parallelism!r})")
        if name is not None and name in self._names:
            raise GraphError(f"two operators are named {name!r}: names identify state, make them unique")
        node_name = name if name is not None else self._unique(label)
        if name is not None:
            self._names[name] = 1
        node_kind = kw.pop("kind", NodeKind.OPERATOR)
        node = LogicalNode(next(self._ids), node_name, node_kind, lambda: None, parallelism, inputs, **kw)
        # operators carry their node's uid as their name: it keys their state in checkpoints
        node.factory = lambda: make(node.uid)
        return self.graph.add(node)

    def source(
        self,
        source: Source,
        *,
        name: str | None = None,
        parallelism: int | None = None,
        uid: str | None = None,
    ) -> Stream:
        """Add a source; returns its stream (``uid``: see :meth:`Stream.uid`)."""
        if not isinstance(source, Source):
            raise ConfigError(f"source: expected a sluice Source, got {type(source).__name__}")
        source.validate()
        node = self._add(
            "source",
            name or source.name,
            PassThroughOperator,
            parallelism,
            [],
            kind=NodeKind.SOURCE,
            spec=source,
        )
        stream = Stream(self, node, schema=source.output_schema)
        return stream.uid(uid) if uid is not None else stream

    def build(self) -> JobGraph:
        """Validate and chain the graph (raises GraphError / ConfigError)."""
        return build_job_graph(self.graph)

    def job_config(
        self,
        restore: str = "latest",
        recover_without_channel_state: int | None = None,
        job_id: str | None = None,
        allow_non_restored_state: bool = False, allow_reprocessing: bool = False,
    ) -> JobConfig:
        return JobConfig(
            job_id=job_id or _job_id(self.name),
            checkpoint=self.checkpoint.with_resolved_key(),  # resolved here, on the driver: travels with the job
            restart=self.restart,
            buffers_per_channel=self.buffers_per_channel,
            max_batch_rows=self.max_batch_rows,
            restore=restore,
            recover_without_channel_state=recover_without_channel_state,
            allow_non_restored_state=allow_non_restored_state, allow_reprocessing=allow_reprocessing,
            metrics=self.metrics,
        )

    # -- running ---------------------------------------------------------------------------------------
    def start(
        self,
        *,
        runtime: Literal["local", "spark"] = "spark",
        restore: str = "latest",
        recover_without_channel_state: int | None = None,
        allow_non_restored_state: bool = False, allow_reprocessing: bool = False,
        faults: FaultHook | None = None,
        spark_master: str | None = None,
        control_endpoint: str | None = DEFAULT_CONTROL_ENDPOINT,
    ) -> JobClient:
        """Start the job in the background and return a client to wait for, cancel or savepoint it.

        Args:
            runtime: ``"spark"`` (embedded local Spark, or the cluster of spark-submit / ``spark_master``) or
                ``"local"`` (threads in this process).
            restore: ``"latest"`` (resume the job's latest completed checkpoint), ``"none"``, or the path of
                a checkpoint or savepoint.
            recover_without_channel_state: drop the unaligned channel state of this checkpoint id on
                restore (loses its in-flight data).
            allow_non_restored_state: restore even if the checkpoint holds state of operator uids this job
                no longer has (renamed or removed operators); that state is dropped.
            allow_reprocessing: run even if a sink holds newer checkpoints than the restored one (duplicates).
            faults: for tests (:mod:`sluice.testing.faults`): a hook the engine calls at named points.
            spark_master: the Spark master URL (``runtime="spark"``).
            control_endpoint: ``HOST:PORT`` of the job's control endpoint and dashboard (port 0: a free
                port; loopback by default), or None for none. Requests need the job's token, written to a
                file only the user can read (docs/operations.md).
        """
        if runtime not in RUNTIMES:
            raise ConfigError(f"run: runtime must be one of {RUNTIMES} (got {runtime!r})")
        job = self.build()
        sock = None
        if control_endpoint is not None:  # bound before the job starts; aiohttp loads only when it serves
            from sluice.control.server import ControlEndpoint
            sock = ControlEndpoint.bind(control_endpoint)
        cfg = self.job_config(
            restore, recover_without_channel_state, None, allow_non_restored_state, allow_reprocessing
        )
        if runtime == "local":
            from sluice.runtime.local import LocalRuntime

            rt: Any = LocalRuntime()
        else:
            from sluice.runtime.spark import SparkRuntime

            rt = SparkRuntime(master=spark_master)
        client = JobClient(job, cfg, rt, faults or NO_FAULTS)
        if sock is not None:
            ControlEndpoint.start(client, sock)
        return client

    def run(self, **kwargs: Any) -> JobResult:
        """Run the job to completion (bounded sources) and return its result. See :meth:`start`."""
        return self.start(**kwargs).wait()
