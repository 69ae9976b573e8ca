"""The Kafka source reader: one consumer per subtask, manually assigned, batches decoded to Arrow.

Positions: a split's position is the offset of the last message *emitted* + 1 (offsets may skip:
transaction markers, compaction), or the end of the partition once the consumer reports it (past a last
transaction marker); the fetch thread (:mod:`.fetcher`) may have read further, which a
checkpoint never records. A bounded split ends once its position reaches the stop offset, or the
consumer reports the end of the partition at or after it (the stop offset itself may be a marker that is
never delivered). Positions are snapshotted per checkpoint and committed to the consumer group when that
checkpoint completes, for lag monitoring only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from sluice.connectors.kafka.dead_letters import route_bad_records
from sluice.connectors.kafka.errors import KafkaDataLossError, KafkaSourceError
from sluice.connectors.kafka.fetcher import Fetcher
from sluice.connectors.kafka.formats import ValueDecoder, make_decoder
from sluice.connectors.kafka.formats.messages import with_metadata
from sluice.connectors.kafka.health import OutageGuard
from sluice.connectors.kafka.metrics import ReaderMetrics
from sluice.connectors.kafka.offsets import KafkaSplit, TopicPartitionKey, parse_split_id
from sluice.connectors.kafka.options import KafkaSourceOptions
from sluice.connectors.kafka.prepared import Prepared, Preparer
from sluice.connectors.kafka.watermarks import PartitionWatermarks
from sluice.errors import ConfigError
from sluice.source import InputStatus, ReaderContext, ReaderOutput, SourceReader, SourceSplit

__all__ = ["KafkaSourceReader"]

log = logging.getLogger("sluice.kafka")
_OUT_OF_RANGE = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
_WARN_EVERY_S = 30.0


@dataclass
class _Split:
    sid: str
    topic: str
    partition: int
    position: int
    end: int | None
    done: bool = False


class KafkaSourceReader(SourceReader):
    """Reads the partitions assigned to one subtask (see the module docstring for positions)."""

    #: how consumers are made (tests replace it with a fake)
    consumer_factory: Callable[[dict[str, Any]], Any] = Consumer

    def __init__(self, options: KafkaSourceOptions, ctx: ReaderContext) -> None:
        self.options = options
        self.ctx = ctx
        self.bounded = options.bounded
        self._splits: dict[TopicPartitionKey, _Split] = {}
        self._no_more = False
        self._consumer: Any = None
        self._decoder = make_decoder(options)
        self._ends: dict[TopicPartitionKey, int | None] = {}
        self._prepare = Preparer(self._decoder, self._ends, options.needs_timestamps)
        self._fetcher: Fetcher | None = None
        self._consumer_conf: dict[str, Any] = {}
        self._commit_failures: list[str] = []
        self._wm = (
            PartitionWatermarks(options.max_out_of_orderness_ms, options.idle_timeout_s)
            if options.event_time is not None
            else None
        )
        self._last_wm: int | None = None
        self._pending_commits: dict[int, dict[TopicPartitionKey, int]] = {}
        self._committed: dict[TopicPartitionKey, int] = {}
        self._timeout_s = options.poll_timeout_ms / 1000
        self._warned: dict[tuple[int, str], float] = {}
        self._outages = OutageGuard(options, ctx)

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._consumer is None:
            group = f"sluice-{self.ctx.job_id}-{self.options.name}"
            conf = self.options.consumer_conf(group, bounded=self.bounded, reader=True)
            conf.setdefault("on_commit", self._on_commit)
            conf.setdefault("error_cb", self._outages.health.on_error)
            # lag, fetch rates and the brokers' connection states
            ReaderMetrics(self.ctx, self._live_positions, self._outages.health.on_stats).configure(conf)
            self._consumer_conf = conf
            self._consumer = self._new_consumer(conf)
            if self.options.fetch_thread:
                self._fetcher = Fetcher(
                    self._consumer.consume,
                    self._prepare_batch,
                    self.options.batch_size,
                    self.options.max_prefetch_bytes // 2,
                    f"{self.options.name}-{self.ctx.subtask}",
                )
                self._fetcher.start()

    def _new_consumer(self, conf: dict[str, Any]) -> Any:
        """The reader's consumer (the native reader makes its own)."""
        return type(self).consumer_factory(conf)

    def _prepare_batch(self, msgs: Any) -> Prepared:
        """A ``consume()`` result split, filtered and decoded (in the fetch thread if there is one)."""
        return self._prepare.finish(self._prepare(msgs))

    def close(self) -> None:
        if self._fetcher is not None:
            self._fetcher.stop()
            self._fetcher = None
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            if self._outages.health.down:
                # librdkafka's close waits for requests in flight, an offset commit to a group coordinator
                # that does not answer among them, until they time out (request_timeout_s): a failover must
                # not wait for a courtesy commit (positions live in checkpoints), so it closes in the background
                threading.Thread(target=consumer.close, name=f"{self.options.name}-close", daemon=True).start()
            else:
                consumer.close()

    # -- splits ----------------------------------------------------------------------------------------
    def add_splits(self, splits: list[SourceSplit]) -> None:
        self.start()
        assign: list[TopicPartition] = []
        for s in splits:
            topic, partition = parse_split_id(s.split_id)
            sp = _Split(s.split_id, topic, partition, int(s.position), None if s.end is None else int(s.end))
            self._splits[(topic, partition)] = sp
            self._ends[(topic, partition)] = sp.end
            if isinstance(s, KafkaSplit):
                self._prepare.adopt(s.value_schema)
            if sp.end is not None and sp.position >= sp.end:
                sp.done = True
                continue
            assign.append(TopicPartition(topic, partition, sp.position))
            if self._wm is not None:
                self._wm.add(sp.sid)
        if assign:
            self._control(lambda: self._consumer.incremental_assign(assign))

    def _live_positions(self) -> dict[TopicPartitionKey, int]:
        """(topic, partition) -> the next offset to emit, of the splits still being read (any thread)."""
        return {(sp.topic, sp.partition): sp.position for sp in list(self._splits.values()) if not sp.done}

    def notify_no_more_splits(self) -> None:
        self._no_more = True

    def _finish(self, sp: _Split) -> None:
        sp.done = True
        tp = TopicPartition(sp.topic, sp.partition)
        self._control(lambda: self._consumer.incremental_unassign([tp]))
        if self._wm is not None:
            self._wm.remove(sp.sid)

    # -- reading ---------------------------------------------------------------------------------------
    def poll_next(self, output: ReaderOutput) -> InputStatus:
        if not any(not sp.done for sp in self._splits.values()):
            self._outages.report(None)  # nothing to read: nothing stalls
            if self.bounded and self._no_more:
                return InputStatus.END_OF_INPUT
            return InputStatus.NOTHING_AVAILABLE
        self._report_commit_failures()
        self._outages.check()
        item = self._next_fetched()
        if item is None:
            self._emit_watermark(output)
            return InputStatus.NOTHING_AVAILABLE
        if item.count:  # data first: an EOF or reset event follows the messages before it
            self._outages.health.on_records()
            self._process(item, output)
        for m in item.events:
            self._on_error(m, m.error())
        self._emit_watermark(output)
        return InputStatus.MORE_AVAILABLE

    def _next_fetched(self) -> Prepared | None:
        if self._fetcher is not None:
            item: Prepared | None = self._fetcher.take(self._timeout_s)
            return item
        msgs = self._consumer.consume(self.options.batch_size, self._timeout_s)
        return self._prepare_batch(msgs) if msgs else None

    def _control(self, fn: Callable[[], Any], wait_s: float | None = None) -> Any:
        """Run a consumer call where the consumer is polled: in the fetch thread if there is one (waiting
        for the result only when ``wait_s`` is given)."""
        if self._fetcher is None:
            return fn()
        fut = self._fetcher.call(fn)
        return fut.result(timeout=wait_s) if wait_s is not None else None

    @property
    def prefetched_records(self) -> int:
        """Records the fetch thread has read ahead of what this reader emitted (not in any checkpoint)."""
        return self._fetcher.queued_records if self._fetcher is not None else 0

    def _process(self, item: Prepared, output: ReaderOutput) -> None:
        by_key = {k: self._splits.get(tp) for k, tp in item.key_tps.items()}
        drop: np.ndarray | None = None
        finished: list[_Split] = []
        many = len(by_key) > 1
        for k, sp in by_key.items():
            if sp is None or sp.done:  # a stale message of a partition no longer assigned
                stale = item.keys == k if many else np.ones(item.count, dtype=bool)
                drop = stale if drop is None else drop | stale
                continue
            offs = item.messages.offsets[item.keys == k] if many else item.messages.offsets
            if offs.size:
                sp.position = max(sp.position, int(offs.max()) + 1)
            if k in item.passed_end and sp.end is not None:
                sp.position = max(sp.position, sp.end)  # everything before the stop offset was delivered
            if sp.end is not None and sp.position >= sp.end:
                finished.append(sp)
        if drop is not None and drop.any():
            item = item.without(drop)
        if item.count:
            self._emit(item, by_key, output)
        for sp in finished:
            self._finish(sp)

    def _emit(self, item: Prepared, by_key: dict[int, _Split | None], output: ReaderOutput) -> None:
        rows: np.ndarray | None = None
        batch: pa.RecordBatch | None = None
        if item.decoded is not None:
            route_bad_records(self.options, self.ctx, item.decoded, item.messages, output)
            batch, rows = item.decoded.batch, item.decoded.rows
            if batch is not None and self.options.include_metadata:
                batch = with_metadata(batch, item.messages, rows)
        if batch is not None and batch.num_rows:
            output.emit(batch)
        if self._wm is not None:
            self._track_event_time(batch, rows, item, by_key)

    # -- event time ------------------------------------------------------------------------------------
    def _track_event_time(
        self,
        batch: pa.RecordBatch | None,
        rows: np.ndarray | None,
        item: Prepared,
        by_key: dict[int, _Split | None],
    ) -> None:
        assert self._wm is not None
        name, keys = self.options.event_time, item.keys
        if self.options.event_time_from_messages:
            times, k = item.messages.timestamps(), keys
        else:
            if batch is None or batch.num_rows == 0:
                return
            if name not in batch.schema.names:
                raise ConfigError(
                    f"KafkaSource {self.options.name!r}: event_time column {name!r} is not in the "
                    f"decoded records (columns: {batch.schema.names})"
                )
            col = batch.column(name)
            if pa.types.is_timestamp(col.type) or pa.types.is_date(col.type):
                col = pc.cast(pc.cast(col, pa.timestamp("ms")), pa.int64())
            times = pc.fill_null(pc.cast(col, pa.int64()), -(2**63)).to_numpy()
            k = keys[rows] if rows is not None else keys
        for key in np.unique(k).tolist():
            sp = by_key.get(key)
            if sp is None:
                continue
            t = times[k == key]
            if t.size and int(t.max()) > -(2**63):
                self._wm.update(sp.sid, int(t.max()))

    def _emit_watermark(self, output: ReaderOutput) -> None:
        if self._wm is None:
            return
        if self._wm.all_idle():
            output.mark_idle()  # downstream stops waiting for this reader's watermark
            return
        wm = self._wm.current()
        if wm is not None and (self._last_wm is None or wm > self._last_wm):
            self._last_wm = wm
            output.emit_watermark(wm)

    # -- consumer events -------------------------------------------------------------------------------
    def _on_error(self, m: Message, err: KafkaError | None) -> None:
        if err is None:
            return
        code = err.code()
        topic, partition, offset = m.topic(), m.partition(), m.offset()
        sp = self._splits.get((topic, partition)) if topic is not None and partition is not None else None
        if code == KafkaError._PARTITION_EOF:
            if sp is not None and not sp.done and offset is not None:
                # every message before the end was emitted (events follow the messages before them), so the
                # offsets between hold no record to read: a transaction's commit marker, aborted or compacted
                # records. Past them, lag and the committed group offsets reach 0 on transactional input.
                sp.position = max(sp.position, offset)
                if sp.end is not None and sp.position >= sp.end:
                    self._finish(sp)
            return
        if code in _OUT_OF_RANGE and sp is not None and not sp.done:
            self._on_out_of_range(sp)
            return
        if err.fatal():
            raise KafkaSourceError(f"KafkaSource {self.options.name!r}: fatal consumer error: {err.str()}")
        self.ctx.metric("kafka_errors")
        self._warn(code, f"{m.topic()}[{m.partition()}]" if m.topic() else "", err.str())

    def _on_out_of_range(self, sp: _Split) -> None:
        if self.options.fail_on_data_loss:
            raise KafkaDataLossError(self.options.name, sp.topic, sp.partition, sp.position)
        tp = TopicPartition(sp.topic, sp.partition)
        timeout = self.options.request_timeout_s
        low, _high = self._control(
            lambda: self._consumer.get_watermark_offsets(tp, timeout=timeout), wait_s=timeout + 5
        )
        log.warning(
            "%s: offset %d of %s[%d] is out of range; fail_on_data_loss=False: continuing at the earliest "
            "offset %d (records in between are lost)",
            self.options.name,
            sp.position,
            sp.topic,
            sp.partition,
            low,
        )
        self.ctx.metric("data_loss_resets")
        self._control(lambda: self._consumer.incremental_unassign([tp]))
        sp.position = int(low)
        if sp.end is not None and sp.position >= sp.end:
            sp.done = True
            if self._wm is not None:
                self._wm.remove(sp.sid)
            return
        at = TopicPartition(sp.topic, sp.partition, sp.position)
        self._control(lambda: self._consumer.incremental_assign([at]))

    def _warn(self, code: int, where: str, text: str) -> None:
        now = time.monotonic()
        if now - self._warned.get((code, where), -_WARN_EVERY_S) >= _WARN_EVERY_S:
            self._warned[(code, where)] = now
            log.warning("%s: consumer error %s: %s", self.options.name, where, text)

    # -- checkpoints -----------------------------------------------------------------------------------
    def snapshot_state(self, checkpoint_id: int) -> list[SourceSplit]:
        if self.options.commit_offsets_on_checkpoint:
            self._pending_commits[checkpoint_id] = {tp: sp.position for tp, sp in self._splits.items()}
        schema = self._decoder.steady_schema if isinstance(self._decoder, ValueDecoder) else None
        return [KafkaSplit(sp.sid, sp.position, sp.end, value_schema=schema) for sp in self._splits.values()]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        offsets = self._pending_commits.pop(checkpoint_id, None)
        for cid in [c for c in self._pending_commits if c < checkpoint_id]:
            del self._pending_commits[cid]
        if not offsets or self._consumer is None:
            return
        changed = [
            TopicPartition(t, p, off) for (t, p), off in offsets.items() if self._committed.get((t, p)) != off
        ]
        if not changed:
            return
        consumer = self._consumer

        def commit() -> None:
            try:
                consumer.commit(offsets=changed, asynchronous=True)
            except KafkaException as exc:
                self._commit_failures.append(f"committing offsets of checkpoint {checkpoint_id} failed: {exc}")

        self._control(commit)
        self._committed.update(offsets)

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        # librdkafka calls this inside consume(), so possibly in the fetch thread: hand it over
        if err is not None:
            self._commit_failures.append(err.str())

    def _report_commit_failures(self) -> None:
        while self._commit_failures:
            text = self._commit_failures.pop(0)
            self.ctx.metric("offset_commit_failures")
            self._warn(-2, "commit", f"offset commit failed (lag monitoring only): {text}")

