"""What the fetch thread does to a ``consume()`` result before the task sees it: split off the events,
drop what lies at or past a split's stop offset, and decode the messages into Arrow.

Decoding here, off the task thread, lets ``pyarrow.json``'s parse (or the Avro decoder) of the next batch run
while the task writes the previous one (both release the GIL). Nothing here touches split positions: the
task advances them from the :class:`Prepared` batches it emits.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.fetcher import split_messages
from sluice.connectors.kafka.formats import Decoded, Decoder, Messages, ValueDecoder
from sluice.connectors.kafka.offsets import TopicPartitionKey

__all__ = ["Prepared", "Preparer"]


@dataclass
class Prepared:
    """One fetched batch, ready to emit.

    Attributes:
        messages: the data messages below their split's stop offset, in order.
        keys: a small int per message naming its (topic, partition) in ``key_tps``.
        key_tps: ``key -> (topic, partition)``.
        passed_end: keys of partitions that delivered a message at or past their stop offset.
        nbytes: bytes of the values as fetched (the prefetch budget counts them).
        events: error and end-of-partition events, after the data.
        decoded: the decoded messages (once :meth:`Preparer.finish` ran).
    """

    messages: Messages
    keys: np.ndarray
    key_tps: dict[int, TopicPartitionKey]
    passed_end: set[int]
    nbytes: int
    events: list[Any] = field(default_factory=list)
    decoded: Decoded | None = None

    @property
    def count(self) -> int:
        """The number of data messages (the fetch thread counts them)."""
        return len(self.messages)

    def without(self, drop: np.ndarray) -> Prepared:
        """This batch without the messages in ``drop`` (a mask); rare: stale partitions."""
        keep = np.flatnonzero(~drop)
        decoded = self.decoded
        if decoded is not None:
            new_index = np.full(len(self.messages), -1, dtype=np.int64)
            new_index[keep] = np.arange(keep.size)
            bad = [(int(new_index[i]), e) for i, e in decoded.bad if new_index[i] >= 0]
            if decoded.batch is not None:
                rows = np.arange(len(self.messages)) if decoded.rows is None else decoded.rows
                row_keep = new_index[rows] >= 0
                decoded = Decoded(
                    decoded.batch.filter(pa.array(row_keep)), new_index[rows][row_keep], bad, decoded.tombstones
                )
            else:
                decoded = replace(decoded, bad=bad)
        return replace(self, messages=self.messages.take(keep), keys=self.keys[keep], decoded=decoded)


class Preparer:
    """Turns ``consume()`` results into :class:`Prepared` batches: ``__call__`` splits and filters them,
    :meth:`finish` decodes them (both in the fetch thread, or in ``poll_next`` without one).

    Args:
        decoder: the reader's decoder, used only from this preparer's thread.
        ends: the reader's ``(topic, partition) -> stop offset or None``; written by the task thread before
            the partition is assigned, so every message of a partition finds its entry.
        need_ts: read the message timestamps here (raw format, metadata columns, Kafka event time).
    """

    def __init__(self, decoder: Decoder, ends: dict[TopicPartitionKey, int | None], need_ts: bool) -> None:
        self.decoder = decoder
        self.ends = ends
        self.need_ts = need_ts
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
        batch = Messages(msgs, values, parts, offsets, nbytes=f.nbytes, topics=topics)
        if drop is not None:
            keep = np.flatnonzero(~drop)
            batch, keys = batch.take(keep), keys[keep]
        if self.need_ts and len(batch):
            batch.timestamps()
        return Prepared(batch, keys, key_tps, passed_end, f.nbytes, f.events)

    def finish(self, item: Prepared) -> Prepared:
        """``item`` with its messages decoded."""
        if item.count and item.decoded is None:  # the native reader may have decoded them already
            with self._lock:  # the decoder's state (a schema): one batch at a time
                item.decoded = self.decoder.decode_messages(item.messages)
        return item

    def adopt(self, schema: pa.Schema | None) -> None:
        """The decoder starts from ``schema`` (from the enumerator's sample or a checkpoint)."""
        if isinstance(self.decoder, ValueDecoder):
            with self._lock:
                self.decoder.adopt(schema)
