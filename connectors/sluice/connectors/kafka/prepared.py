"""What the fetch thread does to a ``consume()`` result before the task sees it: split off the events,
drop what lies at or past a split's stop offset, and decode the values into Arrow.

Decoding here, off the task thread, lets ``pyarrow.json``'s parse (or the Avro decoder) of the next batch run
while the task writes the previous one (both release the GIL). Nothing here touches split positions: the
task advances them from the :class:`Prepared` batches it emits.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.columns import message_timestamps, raw_batch, topic_column
from sluice.connectors.kafka.decoding import Decoded, ValueDecoder
from sluice.connectors.kafka.fetcher import split_messages
from sluice.connectors.kafka.offsets import TopicPartitionKey

if TYPE_CHECKING:
    from sluice.connectors.kafka.source import KafkaSource

__all__ = ["Prepared", "Preparer"]


@dataclass
class Prepared:
    """One fetched batch, ready to emit.

    Attributes:
        msgs: the data messages below their split's stop offset, in order.
        values: their values.
        parts: their partitions.
        offsets: their offsets.
        keys: a small int per message naming its (topic, partition) in ``key_tps``.
        key_tps: ``key -> (topic, partition)``.
        topics: each message's topic when the reader reads several topics, else None.
        ts: message timestamps (ms) when needed (raw format, metadata, Kafka event time).
        decoded: the decoded values (None for the raw format).
        raw: the raw-format batch (None for decoded formats).
        passed_end: keys of partitions that delivered a message at or past their stop offset.
        nbytes: bytes of the values as fetched (the prefetch budget counts them).
        events: error and end-of-partition events, after the data.
    """

    msgs: list[Any]
    values: list[bytes | None]
    parts: np.ndarray
    offsets: np.ndarray
    keys: np.ndarray
    key_tps: dict[int, TopicPartitionKey]
    topics: list[str] | None
    ts: np.ndarray | None
    decoded: Decoded | None
    raw: pa.RecordBatch | None
    passed_end: set[int]
    nbytes: int
    events: list[Any]

    def without(self, drop: np.ndarray) -> Prepared:
        """This batch without the messages in ``drop`` (a mask); rare: stale partitions."""
        keep = np.flatnonzero(~drop)
        sel = keep.tolist()
        decoded = self.decoded
        if decoded is not None and decoded.batch is not None:
            rows = np.arange(len(self.msgs)) if decoded.rows is None else decoded.rows
            new_index = np.full(len(self.msgs), -1, dtype=np.int64)
            new_index[keep] = np.arange(keep.size)
            row_keep = new_index[rows] >= 0
            decoded = Decoded(
                decoded.batch.filter(pa.array(row_keep)),
                new_index[rows][row_keep],
                [(int(new_index[i]), e) for i, e in decoded.bad if new_index[i] >= 0],
                decoded.tombstones,
            )
        elif decoded is not None:
            new_index = np.full(len(self.msgs), -1, dtype=np.int64)
            new_index[keep] = np.arange(keep.size)
            decoded = replace(decoded, bad=[(int(new_index[i]), e) for i, e in decoded.bad if new_index[i] >= 0])
        return replace(
            self,
            msgs=[self.msgs[i] for i in sel],
            values=[self.values[i] for i in sel],
            parts=self.parts[keep],
            offsets=self.offsets[keep],
            keys=self.keys[keep],
            topics=[self.topics[i] for i in sel] if self.topics is not None else None,
            ts=self.ts[keep] if self.ts is not None else None,
            decoded=decoded,
            raw=self.raw.filter(pa.array(~drop)) if self.raw is not None else None,
        )


class Preparer:
    """Turns ``consume()`` results into :class:`Prepared` batches: ``__call__`` splits and filters them,
    :meth:`finish` decodes them (both in the fetch thread, or in ``poll_next`` without one).

    Args:
        source: the source (format and options).
        decoder: the value decoder, used only from this preparer's thread (None for raw).
        ends: the reader's ``(topic, partition) -> stop offset or None``; written by the task thread before
            the partition is assigned, so every message of a partition finds its entry.
    """

    def __init__(self, source: KafkaSource, decoder: ValueDecoder | None, ends: dict[TopicPartitionKey, int | None]) -> None:
        self.source = source
        self.decoder = decoder
        self.ends = ends
        self.need_ts = source.format == "raw" or source.include_metadata or source.event_time == "kafka"
        self._lock = threading.Lock()

    def __call__(self, fetched_msgs: list[Any]) -> Prepared:
        f = split_messages(fetched_msgs)
        msgs, values, parts, offsets = f.msgs, f.values, f.parts, f.offsets
        topic_set = {tp[0] for tp in list(self.ends)}
        topics: list[str] | None = None
        if len(topic_set) <= 1:
            only = next(iter(topic_set)) if topic_set else (msgs[0].topic() if msgs else "")
            keys = parts.astype(np.int64)
            key_tps = {int(k): (only, int(k)) for k in np.unique(keys).tolist()}
        else:
            topics = [str(m.topic()) for m in msgs]
            ids: dict[TopicPartitionKey, int] = {}
            keys = np.array(
                [ids.setdefault((t, p), len(ids)) for t, p in zip(topics, parts.tolist(), strict=True)],
                dtype=np.int64,
            )
            key_tps = {i: tp for tp, i in ids.items()}
        drop: np.ndarray | None = None
        passed_end: set[int] = set()
        for k, tp in key_tps.items():
            end = self.ends.get(tp)
            if end is None:
                continue
            past = (offsets >= end) & (keys == k) if len(key_tps) > 1 else offsets >= end
            if past.any():
                passed_end.add(k)
                drop = past if drop is None else drop | past
        if drop is not None:
            keep = np.flatnonzero(~drop)
            sel = keep.tolist()
            msgs, values = [msgs[i] for i in sel], [values[i] for i in sel]
            parts, offsets, keys = parts[keep], offsets[keep], keys[keep]
            topics = [topics[i] for i in sel] if topics is not None else None
        ts = message_timestamps(msgs) if self.need_ts and msgs else None
        return Prepared(
            msgs, values, parts, offsets, keys, key_tps, topics, ts, None, None, passed_end, f.nbytes, f.events
        )

    def finish(self, item: Prepared) -> Prepared:
        """``item`` with its values decoded (or its raw-format batch built)."""
        if not item.msgs:
            return item
        if self.decoder is not None:
            with self._lock:  # the decoder's schema state: one batch at a time
                item.decoded = self.decoder.decode(item.values, item.nbytes)
        else:
            assert item.ts is not None
            only_topic = item.key_tps[int(item.keys[0])][0]
            item.raw = raw_batch(
                item.msgs,
                item.values,
                item.parts,
                item.offsets,
                item.ts,
                topic_column(len(item.msgs), item.topics, only_topic),
            )
        return item

    def adopt(self, schema: pa.Schema | None) -> None:
        """The decoder starts from ``schema`` (from the enumerator's sample or a checkpoint)."""
        if self.decoder is not None:
            with self._lock:
                self.decoder.adopt(schema)
