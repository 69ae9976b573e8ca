"""The keyed job of ``benchmarks/state_backends.py``: a Kafka topic of int64 keys, one value per key kept
batch-wise in the job's state backend, and Quix Streams counting per key on the same topic.

* :class:`KeyedCount` is a keyed operator on the batch-wise state API (``ctx.create_keyed_backend``,
  ``key_batch``, ``batch_state``), as the operators to come (windows, dedup) use it: per batch, the distinct
  keys and their counts (Arrow ``group_by``), one multi-get, one write batch, and the updated counts emitted.
  With ``payload`` it keeps the batch's last ``payload`` per key instead (put only), for the large-state run.
* :func:`run_job` runs it on the local runtime, Kafka in (a decoder reading the 8-byte big-endian keys with
  NumPy), ``CountSink`` out (or :class:`LastCounts`, which keeps the emitted counts to check them), with
  exactly-once checkpoints; :class:`Pacer` holds the records after the load phase to a rate, so that each
  checkpoint interval changes ~1% of the keys.
* :func:`quix_count` counts per key with Quix Streams (its RocksDB state and changelog topic), timed the
  way :func:`run_job` is (start to end), and returns its final counts.
"""

from __future__ import annotations

import dataclasses
import struct
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from _common import CountSink, Stopwatch, Timing  # type: ignore[import-not-found]
from confluent_kafka import Producer
from sluice.api import Pipeline
from sluice.config import CheckpointConfig, NoRestart
from sluice.connectors.kafka import KafkaSource
from sluice.connectors.kafka.formats.base import Decoded
from sluice.graph import Partitioning
from sluice.operators.base import Collector, Operator, OperatorContext, OperatorSnapshot
from sluice.runtime.job import JobResult
from sluice.sink import Sink, SinkWriter
from sluice.state.api import ValueStateDescriptor
from sluice.state.config import StateBackendConfig

COUNT = ValueStateDescriptor("count", serializer="int64")
PAYLOAD = ValueStateDescriptor("payload", serializer="binary")
KEYS = pa.schema([("key", pa.int64())])


class KeyDecoder:
    """Kafka values are 8-byte big-endian int64 keys: one NumPy view per batch, no loop per message."""

    def decode_messages(self, messages: Any) -> Decoded:
        keys = np.frombuffer(b"".join(messages.values), dtype=">i8").astype(np.int64)
        return Decoded(pa.record_batch([pa.array(keys)], schema=KEYS))


class KeyedCount(Operator):
    """One value per key, batch-wise: the count of its records (or, with ``payload``, its last payload)."""

    def __init__(self, name: str, payload: bool = False) -> None:
        super().__init__(name)
        self.payload = payload

    def setup(self, ctx: OperatorContext, output: Collector) -> None:
        super().setup(ctx, output)
        self.backend = ctx.create_keyed_backend(self.name)

    def initialize_state(self, keyed: list[dict[str, Any]], operator_states: list[Any]) -> None:
        if keyed:
            self.backend.restore(keyed)

    def open(self) -> None:
        self.state = self.backend.batch_state(PAYLOAD if self.payload else COUNT)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if self.payload:
            self.state.put(self.backend.key_batch([batch.column("key")]), batch.column("payload"))
            return
        counted = pa.table({"key": batch.column("key")}).group_by("key").aggregate([("key", "count")])
        keys = counted.column("key").combine_chunks()
        kb = self.backend.key_batch([keys])
        new = pc.add(self.state.get(kb).fill_null(0), counted.column("key_count").combine_chunks())
        self.state.put(kb, new)
        self.output.emit(pa.record_batch([keys, new], names=["key", "count"]))

    def snapshot_state(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        return OperatorSnapshot(keyed=self.backend.snapshot(checkpoint_id, savepoint))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.backend.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.backend.notify_checkpoint_aborted(checkpoint_id)

    def close(self) -> None:
        self.backend.dispose()


class LastCounts(Sink[int]):
    """Keeps every batch the keyed count emits (key, count), commits nothing: :meth:`counts` is each key's
    final count, to compare with the input. Keeping a reference per batch costs next to nothing."""

    name = "last-counts"

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []

    def create_writer(self, ctx: Any, restored: list[Any]) -> SinkWriter[int]:
        return _Keep(self.batches)

    def counts(self) -> dict[int, int]:
        if not self.batches:
            return {}
        last = pa.Table.from_batches(self.batches).group_by("key").aggregate([("count", "max")])
        return dict(zip(last.column("key").to_pylist(), last.column("count_max").to_pylist(), strict=True))


class _Keep(SinkWriter[int]):
    def __init__(self, batches: list[pa.RecordBatch]) -> None:
        self.batches = batches

    def write(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)

    def prepare_commit(self, checkpoint_id: int) -> list[int]:
        return []


def input_counts(keys: np.ndarray) -> dict[int, int]:
    """The count per key of the topic's records (the reference both sides' counts are compared with)."""
    uniq, n = np.unique(keys, return_counts=True)
    return dict(zip(uniq.tolist(), n.tolist(), strict=True))


@dataclass
class Pacer:
    """A map_batches function: the first ``free`` records at full speed (the load phase), then ``rate``
    records per second. ``load_end`` is when the load phase ended (epoch seconds)."""

    free: int
    rate: float
    seen: int = 0
    start: float | None = None
    load_end: float | None = None

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        self.seen += batch.num_rows
        if self.seen > self.free:
            if self.start is None:
                self.start, self.load_end = time.perf_counter(), time.time()
            delay = self.start + (self.seen - self.free) / self.rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        return batch


def produce(bootstrap: str, topic: str, keys: np.ndarray) -> float:
    """Produce each key as an 8-byte big-endian value (and message key) to partition 0; seconds taken."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                  "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000, "log_level": 0})  # fmt: skip
    t0 = time.perf_counter()
    pack = struct.Struct(">q").pack
    for k in keys.tolist():
        b = pack(k)
        while True:
            try:
                p.produce(topic, b, b, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(300) != 0:
        raise RuntimeError("messages not delivered")
    return time.perf_counter() - t0


@dataclass
class JobRun:
    """A finished job: its result, wall time and (paced runs) when its load phase ended."""

    result: JobResult
    seconds: float
    cpu_seconds: float = 0.0  #: CPU time of the process tree over the run (this process, the broker, ...)
    load_end: float | None = None
    checkpoints: list[Any] = field(default_factory=list)

    def gauge(self, name: str) -> float | None:
        for vm in self.result.vertex_metrics.values():
            if name in (vm.get("gauges") or {}):
                return float(vm["gauges"][name])
        return None


def run_job(
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    backend: StateBackendConfig,
    storage: str,
    *,
    interval: float | None = 1.0,
    pace: Pacer | None = None,
    storage_options: dict[str, Any] | None = None,
    restore: str = "none",
    num_retained: int = 1,
    sink: Sink[Any] | None = None,
) -> JobRun:
    """The keyed count over ``topic`` up to ``ends`` on the local runtime, parallelism 1, timed from its start
    to its end (``run()`` returns after its last checkpoint); ``sink`` instead of :class:`CountSink`."""
    p = Pipeline("state-bench", parallelism=1, restart=NoRestart(), state_backend=backend,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage, storage_options=storage_options or {},
                                            num_retained=num_retained))  # fmt: skip
    batch = 10_000 if pace is None else max(200, int(pace.rate / 20))
    src = KafkaSource(bootstrap, topic, format=KeyDecoder(), batch_size=batch,
                      stopping_offsets={(topic, q): off for q, off in ends.items()}, commit_offsets_on_checkpoint=False)  # fmt: skip
    s = p.source(src)
    if pace is not None:
        s = s.map_batches(pace, name="pace")
    key = s.key_by("key").key
    counted = s._then("process", "keyed-count", lambda n: KeyedCount(n), None, s._edge(Partitioning.HASH, key), None, key=key)
    counted.sink(sink or CountSink())
    with Stopwatch() as sw:
        result = p.run(runtime="local", restore=restore)
    run = JobRun(result, sw.timing.wall, sw.timing.cpu, pace.load_end if pace else None)
    run.checkpoints = [c for c in result.checkpoints if c.status == "completed"]
    return run


def keyed_stats(stats: Any) -> dict[str, float]:
    """A completed checkpoint's keyed figures, summed over its tasks (from the job's checkpoint statistics)."""
    tasks = [t for t in stats.tasks.values() if t.get("keyed_bytes")]
    return {
        "full": sum(t["keyed_bytes"] for t in tasks),
        "persisted": sum(t["keyed_persisted_bytes"] for t in tasks),
        "sync_async_s": max((t["sync_s"] + t["async_s"] for t in tasks), default=0.0),
        "sync_s": max((t["sync_s"] for t in tasks), default=0.0),
        "duration_s": stats.duration_s,
    }


def payload_rows(split: int, start: int, end: int) -> pa.RecordBatch:
    """Generator rows: keys ``start..end`` with a random 200-byte payload each."""
    n, size = end - start, 200
    data = np.random.default_rng(start).bytes(n * size)
    offsets = pa.py_buffer(np.arange(0, (n + 1) * size, size, dtype=np.int32).tobytes())
    payload = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(data)])
    return pa.record_batch([pa.array(np.arange(start, end, dtype=np.int64)), payload], names=["key", "payload"])


def large_state_job(backend: StateBackendConfig, target_mb: int, root: str) -> dict[str, Any]:
    """Write ``target_mb`` of state (a 200-byte payload per key, each key once) through the keyed operator in
    a job (a generator source, so the data need not sit in a broker), checkpoints every 5 s; the state size
    is the largest checkpoint's keyed size (its statistics), the peak RSS this process's."""
    from sluice.connectors.generator import GeneratorSource

    records = (target_mb << 20) // 230
    p = Pipeline("state-large", parallelism=1, restart=NoRestart(), state_backend=backend,
                 checkpoint=CheckpointConfig(interval=5.0, storage=f"{root}/chk"))  # fmt: skip
    s = p.source(GeneratorSource(num_splits=1, records_per_split=records, batch_size=20_000, rows=payload_rows))
    key = s.key_by("key").key
    s._then("process", "keyed-last", lambda n: KeyedCount(n, payload=True), None, s._edge(Partitioning.HASH, key), None, key=key).sink(CountSink())
    t0 = time.perf_counter()
    result = p.run(runtime="local", restore="none")
    done = [c for c in result.checkpoints if c.status == "completed"]  # the newest (CheckpointConfig.history_size)
    seconds, completed = time.perf_counter() - t0, result.checkpoint_counts.completed
    return {"records": records, "seconds": seconds, "checkpoints": completed,
            "state_mb": max((keyed_stats(c)["full"] for c in done), default=0) / (1 << 20)}  # fmt: skip


#: Apache Kafka's defaults of the topic configs Quix Streams reads (``retention.ms``: 7 days)
KAFKA_TOPIC_DEFAULTS = {"retention.ms": "604800000", "retention.bytes": "-1"}


def quix_on_tansu() -> None:
    """tansu's DescribeConfigs returns no entries (tests/broker_quirks/quix_describe_configs.py), where Kafka
    returns every config with its default; Quix Streams reads ``retention.ms`` of a stateful dataframe's
    topic to configure its changelog topic and fails with ``KeyError``. Fill in Kafka's defaults."""
    from quixstreams.models.topics.admin import TopicAdmin

    inspect = TopicAdmin.inspect_topics
    if getattr(inspect, "tansu_defaults", False):
        return

    def with_defaults(self: Any, topic_names: list[str], timeout: float = 30) -> Any:
        configs = inspect(self, topic_names, timeout)
        return {
            name: cfg if cfg is None else dataclasses.replace(cfg, extra_config={**KAFKA_TOPIC_DEFAULTS, **cfg.extra_config})
            for name, cfg in configs.items()
        }

    with_defaults.tansu_defaults = True  # type: ignore[attr-defined]
    TopicAdmin.inspect_topics = with_defaults  # type: ignore[method-assign]


def quix_count(bootstrap: str, topic: str, records: int, state_dir: str | None = None) -> tuple[Timing, dict[int, int]]:
    """Quix Streams counting per message key with its RocksDB state (and changelog topic), commits every
    second, over the first ``records`` records of ``topic``, timed as :func:`run_job` is: from
    ``Application.run`` (consumer group join included) to its end, stopped after the last record (its final
    checkpoint commits the state). Returns the timing and each key's final count (what its state holds)."""
    from quixstreams import Application

    quix_on_tansu()

    counts: dict[bytes, int] = {}
    with tempfile.TemporaryDirectory(dir=state_dir) as d:
        app = Application(broker_address=bootstrap, consumer_group=f"quix-{time.time_ns()}", auto_offset_reset="earliest",
                          state_dir=d, commit_interval=1.0, loglevel="WARNING",
                          consumer_extra_config={"session.timeout.ms": 6000})  # fmt: skip
        source = app.topic(topic, key_deserializer="bytes", value_deserializer="bytes")
        seen = [0]

        def count(value: bytes, state: Any) -> int:
            n: int = state.get("count", 0) + 1
            state.set("count", n)
            counts[value] = n  # the value is the key's 8 bytes, as the message key
            seen[0] += 1
            if seen[0] == records:
                app.stop()  # the run loop ends, then commits its checkpoint
            return n

        app.dataframe(source).apply(count, stateful=True)
        with Stopwatch() as sw:
            app.run(timeout=120.0)  # the timeout only guards against a hang: it stops after `records`
    if seen[0] != records:
        raise RuntimeError(f"quix: counted {seen[0]} of {records} records")
    return sw.timing, {int.from_bytes(k, "big", signed=True): v for k, v in counts.items()}


__all__: Sequence[str] = ["JobRun", "KeyDecoder", "KeyedCount", "LastCounts", "Pacer", "input_counts", "keyed_stats",
                          "produce", "quix_count", "run_job"]  # fmt: skip
