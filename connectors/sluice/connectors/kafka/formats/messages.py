"""A batch of fetched Kafka messages as the formats see it, and the Arrow columns of message fields."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["HEADERS", "METADATA_FIELDS", "TIMESTAMP", "Messages", "timestamp_column", "with_metadata"]

#: the Arrow type of message timestamps
TIMESTAMP = pa.timestamp("ms", tz="UTC")
#: the columns ``include_metadata=True`` appends to decoded values
METADATA_FIELDS = [
    pa.field("_key", pa.binary()),
    pa.field("_topic", pa.string()),
    pa.field("_partition", pa.int32()),
    pa.field("_offset", pa.int64()),
    pa.field("_timestamp", TIMESTAMP),
]


def timestamp_column(ts: np.ndarray) -> pa.Array:
    """Message timestamps (ms; negative = none) as a UTC timestamp column."""
    return pa.array(ts, pa.int64(), mask=ts < 0).cast(TIMESTAMP)


#: the Arrow type of message headers: a list of (key, value) pairs
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


class Messages:
    """Data messages of a reader's partitions, in fetch order (none at or past its split's stop offset).

    Formats read them through the columns and accessors below, which the native reader
    (:mod:`sluice.connectors.kafka.native_messages`) serves from Arrow columns without a Python object per
    message; ``messages`` (the message objects) is there for decoders of your own.

    Attributes:
        messages: the ``confluent_kafka.Message`` objects (``key()``, ``headers()``, ``timestamp()``...).
        values: each message's value (None: a tombstone).
        partitions: each message's partition (int32).
        offsets: each message's offset (int64).
        nbytes: at least the values' total length (None: unknown).
    """

    def __init__(
        self,
        messages: list[Any],
        values: list[bytes | None],
        partitions: np.ndarray,
        offsets: np.ndarray,
        *,
        nbytes: int | None = None,
        topics: list[str] | None = None,
        timestamps: np.ndarray | None = None,
    ) -> None:
        self._messages = messages
        self._values = values
        self.partitions = partitions
        self.offsets = offsets
        self.nbytes = nbytes
        self._topics = topics  # None: every message has the first one's topic
        self._timestamps = timestamps

    @classmethod
    def of(cls, messages: list[Any]) -> Messages:
        """The batch of ``messages`` (data messages, no error events)."""
        values = [m.value() for m in messages]
        return cls(
            messages,
            values,
            np.array([m.partition() for m in messages], dtype=np.int32),
            np.array([m.offset() for m in messages], dtype=np.int64),
            nbytes=sum(len(v) for v in values if v is not None),
            topics=[m.topic() for m in messages],
        )

    @property
    def messages(self) -> list[Any]:
        """The message objects (``topic()``, ``partition()``, ``offset()``, ``key()``, ``value()``,
        ``headers()``, ``timestamp()``)."""
        return self._messages

    @property
    def values(self) -> list[bytes | None]:
        """Each message's value (None: a tombstone)."""
        return self._values

    def __len__(self) -> int:
        return len(self.partitions)

    @property
    def topic_names(self) -> list[str] | None:
        """Each message's topic, or None when they all have the first one's."""
        return self._topics

    def topic_at(self, i: int) -> str:
        """The topic of message ``i``."""
        return str(self.messages[i].topic() or "")

    def keys(self) -> list[bytes | None]:
        """Each message's key."""
        return [m.key() for m in self.messages]

    def key_column(self) -> pa.Array:
        """Each message's key as a binary column."""
        return pa.array(self.keys(), pa.binary())

    def value_column(self) -> pa.Array:
        """Each message's value as a binary column."""
        return pa.array(self.values, pa.binary())

    def headers_column(self) -> pa.Array:
        """Each message's headers as a :data:`HEADERS` column (null: none)."""
        headers = [m.headers() for m in self.messages]
        return pa.array(headers, HEADERS) if any(h is not None for h in headers) else pa.nulls(len(self), HEADERS)

    def timestamps(self) -> np.ndarray:
        """Each message's timestamp in ms (negative: none)."""
        if self._timestamps is None:
            self._timestamps = np.array([m.timestamp()[1] for m in self.messages], dtype=np.int64)
        return self._timestamps

    def topics(self) -> pa.Array:
        """Each message's topic as a string column."""
        if self._topics is None:
            only = self.messages[0].topic() if self.messages else ""
            return pa.DictionaryArray.from_arrays(np.zeros(len(self), dtype=np.int32), [only]).cast(pa.string())
        return pa.array(self._topics, pa.string())

    def take(self, keep: np.ndarray) -> Messages:
        """The messages at the indices ``keep``."""
        sel = keep.tolist()
        return Messages(
            [self.messages[i] for i in sel],
            [self.values[i] for i in sel],
            self.partitions[keep],
            self.offsets[keep],
            nbytes=self.nbytes,
            topics=[self._topics[i] for i in sel] if self._topics is not None else None,
            timestamps=self._timestamps[keep] if self._timestamps is not None else None,
        )


def with_metadata(batch: pa.RecordBatch, messages: Messages, rows: np.ndarray | None) -> pa.RecordBatch:
    """``batch`` plus ``_key, _topic, _partition, _offset, _timestamp`` of the messages its ``rows`` came from
    (None: one row per message, in order)."""
    sel: Any = rows if rows is not None else slice(None)
    topics = messages.topics()
    keys = messages.key_column()
    cols = {
        "_key": keys.take(pa.array(rows)) if rows is not None else keys,
        "_topic": topics.take(pa.array(rows)) if rows is not None else topics,
        "_partition": pa.array(messages.partitions[sel]),
        "_offset": pa.array(messages.offsets[sel]),
        "_timestamp": timestamp_column(messages.timestamps()[sel]),
    }
    for name, col in cols.items():
        batch = batch.append_column(name, col)
    return batch
