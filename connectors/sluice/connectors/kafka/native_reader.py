"""The Kafka source's native read path: fetch and decode into Arrow without the GIL.

The extension ``sluice.connectors.kafka._native`` (Rust, in ``native/``: librdkafka through ``rdkafka-sys``,
``arrow-json``, PyO3) consumes a batch of messages and turns it into Arrow columns -- key, value,
timestamp, partition, offset, headers when a format needs them -- dropping what lies at or past a split's
stop offset; for ``format="json"`` with a ``schema`` it also decodes the values into the record batch,
with the bad-record contract of the formats (each bad value an ``(index, error)``), and so it does for the
schema registry's wire format (``format="avro"`` and ``"json"`` with ``schema_registry``) and plain Avro
(``avro_schema``), once Python has told it the schema ids (``native_wire.py``). All of it runs with the
GIL released, so a reader's fetch thread no longer competes with the task threads for it; Python gets
each batch through the Arrow C data interface. Other formats decode the value column in Python as before.

:class:`NativeKafkaSourceReader` is the Python reader (:class:`~.reader.KafkaSourceReader`: splits,
positions, checkpoints, watermarks, dead letters, metrics) on :class:`NativeConsumer`, which makes the
calls the reader makes of ``confluent_kafka.Consumer`` and dispatches librdkafka's callbacks (errors,
statistics, commits, log lines) on the thread that consumes, as confluent-kafka does.

Which reader runs: the source's ``reader`` option (``"auto"``, ``"native"``, ``"python"``; the environment
variable ``SLUICE_KAFKA_READER`` pins the default where a source is built); ``"auto"`` takes the native one
where it is built and can take the consumer settings (a librdkafka built without OpenSSL cannot take
``security.protocol=ssl``), today's otherwise. One log line per source and process says which and why.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from sluice.connectors.kafka.formats import Decoded, Decoder
from sluice.connectors.kafka.native_choice import choose_reader, extension, settings
from sluice.connectors.kafka.native_messages import ArrowMessages, NativeEvent
from sluice.connectors.kafka.native_wire import RECORDS, WireTable, framing
from sluice.connectors.kafka.offsets import TopicPartitionKey
from sluice.connectors.kafka.options import KafkaSourceOptions
from sluice.connectors.kafka.prepared import Prepared
from sluice.connectors.kafka.reader import KafkaSourceReader
from sluice.source import ReaderContext, SourceReader

__all__ = ["NativeConsumer", "NativeKafkaSourceReader", "create_reader"]

log = logging.getLogger("sluice.kafka")

#: syslog level -> logging level (as confluent-kafka maps librdkafka's log lines)
_LEVELS = {0: 50, 1: 50, 2: 50, 3: 40, 4: 30, 5: 20, 6: 20, 7: 10}
_logged: set[tuple[str, str]] = set()
_lock = threading.Lock()


def create_reader(options: KafkaSourceOptions, ctx: ReaderContext) -> SourceReader:
    """The reader :func:`choose_reader` picks, with one log line per source and choice in this process."""
    kind, why = choose_reader(options)
    with _lock:
        first = (options.name, kind) not in _logged
        _logged.add((options.name, kind))
    if first:
        log.info("KafkaSource %r: %s reader (%s)", options.name, kind, why)
    if kind == "native":
        return NativeKafkaSourceReader(options, ctx)
    return KafkaSourceReader(options, ctx)


def _kafka_exception(exc: Exception) -> KafkaException:
    code, text = exc.args
    return KafkaException(KafkaError(code, text))


class NativeConsumer:
    """The calls :class:`~.reader.KafkaSourceReader` makes of ``confluent_kafka.Consumer``, on the native
    consumer; ``consume`` returns the native batch tuple (or None) instead of messages.

    Args:
        conf: the reader's confluent-kafka configuration (callbacks included).
        options: the source's options (what to decode natively).
        ends: the reader's ``(topic, partition) -> stop offset``, read when a partition is assigned.
        decoder: the reader's decoder (a wire-format one is followed by :attr:`wire`).
    """

    def __init__(
        self,
        conf: Mapping[str, Any],
        options: KafkaSourceOptions,
        ends: Mapping[TopicPartitionKey, int | None],
        decoder: Decoder | None = None,
    ) -> None:
        assert extension() is not None
        conf_pairs, self._callbacks = settings(conf)
        fmt = options.format
        json_schema = (
            options.value_schema
            if fmt == "json" and options.schema_registry is None and options.value_schema is not None
            else None
        )
        framed = framing(decoder) if decoder is not None and json_schema is None else None
        self.decodes = json_schema is not None
        try:
            self._c = extension().Consumer(
                conf_pairs,
                need_ts=True,
                need_keys=True,
                need_headers=fmt == "raw" or not isinstance(fmt, str),
                json_schema=json_schema,
                wire=framed,
                max_record_bytes=options.max_record_bytes,
            )
        except extension().KafkaNativeError as exc:
            raise _kafka_exception(exc) from None
        self._ends = ends
        #: the schema-id table of a wire-format decoder (None: the format is not decoded that way)
        self.wire = None if framed is None or decoder is None else WireTable(decoder, self._c.configure_wire)
        if self.wire is not None:
            self.wire.update()  # a fixed reader schema (plain Avro) decodes from the first batch

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except extension().KafkaNativeError as exc:
            raise _kafka_exception(exc) from None

    def consume(self, num_messages: int, timeout: float) -> Any:
        """A native batch ``(fields, tps, passed_end, nbytes, events, decoded)`` or None; the callbacks
        librdkafka reported meanwhile run first, on this thread."""
        out, callbacks = self._call(self._c.consume, num_messages, timeout)
        if callbacks:
            self._dispatch(callbacks)
        return out

    def _dispatch(self, callbacks: list[tuple[Any, ...]]) -> None:
        cbs = self._callbacks
        for cb in callbacks:
            kind = cb[0]
            if kind == "stats" and "stats_cb" in cbs:
                cbs["stats_cb"](cb[1])
            elif kind == "error" and "error_cb" in cbs:
                cbs["error_cb"](KafkaError(cb[1], cb[3], fatal=cb[2]))
            elif kind == "commit" and "on_commit" in cbs:
                err = None if cb[1] == 0 else KafkaError(cb[1], cb[2])
                cbs["on_commit"](err, [TopicPartition(t, p, o) for t, p, o, _ in cb[3]])
            elif kind == "log" and "logger" in cbs:
                cbs["logger"].log(_LEVELS.get(cb[1], 20), "%s [%s] %s", cb[2], "sluice-native", cb[3])

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        at = [(tp.topic, tp.partition, tp.offset, self._ends.get((tp.topic, tp.partition))) for tp in tps]
        self._call(self._c.incremental_assign, at)

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        self._call(self._c.incremental_unassign, [(tp.topic, tp.partition) for tp in tps])

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        self._call(self._c.commit, [(tp.topic, tp.partition, tp.offset) for tp in offsets], asynchronous)

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None) -> tuple[int, int]:
        low, high = self._call(self._c.get_watermark_offsets, tp.topic, tp.partition, timeout or 10.0)
        return int(low), int(high)

    def close(self) -> None:
        callbacks = self._c.close()
        if callbacks:
            self._dispatch(callbacks)


class NativeKafkaSourceReader(KafkaSourceReader):
    """:class:`~.reader.KafkaSourceReader` on :class:`NativeConsumer` (same splits, positions, checkpoints,
    watermarks, bad records and metrics; the batches arrive as Arrow)."""

    _wire: WireTable | None = None

    def _new_consumer(self, conf: dict[str, Any]) -> NativeConsumer:
        consumer = NativeConsumer(conf, self.options, self._ends, self._decoder)
        self._wire = consumer.wire
        return consumer

    def _prepare_batch(self, out: Any) -> Prepared:
        fields, tps, passed_end, nbytes, events, decoded = out
        messages = ArrowMessages(pa.RecordBatch.from_struct_array(fields), [tuple(tp) for tp in tps], nbytes)
        item = Prepared(
            messages,
            messages.tp.astype(np.int64),
            dict(enumerate(messages.tps)),
            set(passed_end),
            nbytes,
            [NativeEvent(*e) for e in events],
        )
        wire = self._wire
        if decoded is not None:
            item.decoded = as_decoded(decoded)
            if wire is not None:
                item.decoded = wire.finish(item.decoded)
                RECORDS["native"] += item.count
            return self._prepare.finish(item)
        item = self._prepare.finish(item)  # decodes in Python what was not decoded natively
        if wire is not None and item.count:
            RECORDS["python"] += item.count
            wire.update()  # the schema ids Python learnt, for the next batches
        return item


def as_decoded(decoded: tuple[Any, Any, list[tuple[int, str]], int]) -> Decoded:
    """The native decoded tuple ``(StructArray or None, Int64Array or None, bad, tombstones)``."""
    batch, rows, bad, tombstones = decoded
    return Decoded(
        None if batch is None else pa.RecordBatch.from_struct_array(batch),
        None if rows is None else rows.to_numpy(),
        [(int(i), str(e)) for i, e in bad],
        int(tombstones),
    )
