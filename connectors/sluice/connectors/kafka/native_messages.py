"""The native reader's batches as the formats and the reader see them: :class:`ArrowMessages` serves the
:class:`~sluice.connectors.kafka.formats.messages.Messages` accessors from Arrow columns (no Python object
per message unless a decoder of your own asks for ``messages``), :class:`NativeEvent` is an error or
end-of-partition event shaped like the ``confluent_kafka.Message`` that carries one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaError
from sluice.connectors.kafka.formats.messages import HEADERS, Messages

__all__ = ["ArrowMessages", "NativeEvent", "NativeMessage"]

_FATAL = KafkaError._FATAL


class ArrowMessages(Messages):
    """Messages held as Arrow columns (``tp``, ``partition``, ``offset``, ``value``, ``timestamp``, ``key``
    and, when asked for, ``headers``); ``tps[tp]`` is the (topic, partition) of a ``tp`` index.

    Args:
        fields: the columns, one row per message.
        tps: (topic, partition) by ``tp`` index.
        nbytes: the values' total length.
    """

    def __init__(self, fields: pa.RecordBatch, tps: list[tuple[str, int]], nbytes: int | None) -> None:
        self.fields = fields
        self.tps = tps
        self.tp = fields.column("tp").to_numpy()
        self.partitions = fields.column("partition").to_numpy()
        self.offsets = fields.column("offset").to_numpy()
        self.nbytes = nbytes
        self._values_list: list[bytes | None] | None = None
        self._message_list: list[Any] | None = None
        self._timestamps = fields.column("timestamp").to_numpy() if "timestamp" in fields.schema.names else None
        names = {t for t, _ in tps}
        self._one_topic = next(iter(names)) if len(names) == 1 else None
        self._topics = None if self._one_topic is not None or not len(fields) else self._topic_list()

    def _topic_list(self) -> list[str]:
        names = [t for t, _ in self.tps]
        return [names[i] for i in self.tp.tolist()]

    @property
    def messages(self) -> list[Any]:
        if self._message_list is None:
            self._message_list = [NativeMessage(self, i) for i in range(len(self))]
        return self._message_list

    @property
    def values(self) -> list[bytes | None]:
        if self._values_list is None:
            self._values_list = self.fields.column("value").to_pylist()
        return self._values_list

    def __len__(self) -> int:
        return int(self.fields.num_rows)

    def topic_at(self, i: int) -> str:
        return self.tps[int(self.tp[i])][0]

    def keys(self) -> list[bytes | None]:
        keys: list[bytes | None] = self.key_column().to_pylist()
        return keys

    def key_column(self) -> pa.Array:
        return self.fields.column("key")

    def value_column(self) -> pa.Array:
        return self.fields.column("value")

    def headers_column(self) -> pa.Array:
        if "headers" not in self.fields.schema.names:
            raise RuntimeError("the native reader was built without headers for this format")
        return self.fields.column("headers").cast(HEADERS)

    def timestamps(self) -> np.ndarray:
        if self._timestamps is None:
            raise RuntimeError("the native reader was built without timestamps")
        return self._timestamps

    def topics(self) -> pa.Array:
        if self._one_topic is not None or not len(self):
            only = self._one_topic or ""
            return pa.DictionaryArray.from_arrays(np.zeros(len(self), dtype=np.int32), [only]).cast(pa.string())
        return pa.DictionaryArray.from_arrays(self.fields.column("tp"), [t for t, _ in self.tps]).cast(pa.string())

    def take(self, keep: np.ndarray) -> ArrowMessages:
        return ArrowMessages(self.fields.take(pa.array(keep, pa.int64())), self.tps, self.nbytes)


class NativeMessage:
    """One message of :class:`ArrowMessages`, with the ``confluent_kafka.Message`` accessors."""

    __slots__ = ("_batch", "_i")

    def __init__(self, batch: ArrowMessages, i: int) -> None:
        self._batch = batch
        self._i = i

    def topic(self) -> str:
        return self._batch.topic_at(self._i)

    def partition(self) -> int:
        return int(self._batch.partitions[self._i])

    def offset(self) -> int:
        return int(self._batch.offsets[self._i])

    def value(self) -> bytes | None:
        return self._batch.values[self._i]

    def key(self) -> bytes | None:
        key: bytes | None = self._batch.key_column()[self._i].as_py()
        return key

    def timestamp(self) -> tuple[int, int]:
        """(type, ms): type 1 (a timestamp) or 0 (none, ms -1); the native reader does not tell create
        time from log-append time."""
        ts = int(self._batch.timestamps()[self._i])
        return (1, ts) if ts >= 0 else (0, -1)

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        pairs = self._batch.headers_column()[self._i].as_py()
        return None if pairs is None else [(h["key"], h["value"]) for h in pairs]

    def error(self) -> None:
        return None

    def __len__(self) -> int:
        v = self.value()
        return 0 if v is None else len(v)


class NativeEvent:
    """An error or end-of-partition event of the native consumer, shaped like the ``confluent_kafka.Message``
    that carries one (the reader's ``_on_error`` reads both)."""

    __slots__ = ("_err", "_offset", "_partition", "_topic")

    def __init__(self, code: int, topic: str | None, partition: int, offset: int, text: str) -> None:
        self._err = KafkaError(code, text, fatal=code == _FATAL)
        self._topic = topic
        self._partition = partition
        self._offset = offset

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition if self._topic is not None else None

    def offset(self) -> int | None:
        return self._offset

    def error(self) -> KafkaError:
        return self._err
