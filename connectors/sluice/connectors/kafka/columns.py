"""Arrow columns built from Kafka messages: the ``raw`` format, metadata columns, dead letters."""

from __future__ import annotations

import base64
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.decoding import DEAD_LETTER_SCHEMA, Decoded
from sluice.errors import BadRecordError
from sluice.source import ReaderContext, ReaderOutput

if TYPE_CHECKING:
    from sluice.connectors.kafka.source import KafkaSource

#: the side output dead letters go to
DEAD_LETTERS = "dead_letters"

__all__ = [
    "DEAD_LETTERS",
    "METADATA_FIELDS",
    "RAW_SCHEMA",
    "dead_letters",
    "message_timestamps",
    "raw_batch",
    "route_bad_records",
    "timestamps",
    "topic_column",
    "with_metadata",
]

_TS = pa.timestamp("ms", tz="UTC")
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
#: the columns of the ``raw`` format
RAW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", _HEADERS),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", _TS),
    ]
)
#: the columns ``include_metadata=True`` appends to decoded values
METADATA_FIELDS = [
    pa.field("_key", pa.binary()),
    pa.field("_topic", pa.string()),
    pa.field("_partition", pa.int32()),
    pa.field("_offset", pa.int64()),
    pa.field("_timestamp", _TS),
]


def timestamps(ts: np.ndarray) -> pa.Array:
    """Message timestamps (ms; negative = none) as a UTC timestamp column."""
    return pa.array(ts, pa.int64(), mask=ts < 0).cast(_TS)


def message_timestamps(msgs: list[Any]) -> np.ndarray:
    """The ``timestamp()`` of every message, in ms."""
    return np.array([m.timestamp()[1] for m in msgs], dtype=np.int64)


def topic_column(n: int, topics: list[str] | None, only: str) -> pa.Array:
    """The topic of each row: ``topics`` if the reader reads several, else ``only`` repeated."""
    if topics is None:
        return pa.DictionaryArray.from_arrays(np.zeros(n, dtype=np.int32), [only]).cast(pa.string())
    return pa.array(topics, pa.string())


def raw_batch(
    msgs: list[Any],
    values: list[bytes | None],
    parts: np.ndarray,
    offsets: np.ndarray,
    ts: np.ndarray,
    topics: pa.Array,
) -> pa.RecordBatch:
    """The ``raw`` format: key, value, headers, topic, partition, offset, timestamp."""
    headers = [m.headers() for m in msgs]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.key() for m in msgs], pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(headers, _HEADERS)
            if any(h is not None for h in headers)
            else pa.nulls(len(msgs), _HEADERS),
            topics,
            pa.array(parts),
            pa.array(offsets),
            timestamps(ts),
        ],
        names=["key", "value", "headers", "topic", "partition", "offset", "timestamp"],
    )


def with_metadata(
    batch: pa.RecordBatch,
    msgs: list[Any],
    rows: np.ndarray | None,
    parts: np.ndarray,
    offsets: np.ndarray,
    ts: np.ndarray,
    topics: pa.Array,
) -> pa.RecordBatch:
    """``batch`` plus ``_key, _topic, _partition, _offset, _timestamp`` of the messages its rows came from."""
    sel: Any = rows if rows is not None else slice(None)
    picked = [msgs[i] for i in rows.tolist()] if rows is not None else msgs
    cols = {
        "_key": pa.array([m.key() for m in picked], pa.binary()),
        "_topic": topics.take(pa.array(rows)) if rows is not None else topics,
        "_partition": pa.array(parts[sel]),
        "_offset": pa.array(offsets[sel]),
        "_timestamp": timestamps(ts[sel]),
    }
    for name, col in cols.items():
        batch = batch.append_column(name, col)
    return batch


#: control characters other than tab and line breaks: a value holding them is binary, not text
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _text_or_base64(raw: list[bytes | None]) -> tuple[pa.Array, pa.Array]:
    """Each value as text (valid UTF-8 without control characters), or else as base64 in the second
    column; null stays null."""
    text: list[str | None] = []
    b64: list[str | None] = []
    for v in raw:
        if v is None:
            text.append(None)
            b64.append(None)
            continue
        try:
            s: str | None = v.decode("utf-8")
        except UnicodeDecodeError:
            s = None
        if s is not None and not _CONTROL.search(s):
            text.append(s)
            b64.append(None)
        else:
            text.append(None)
            b64.append(base64.b64encode(v).decode("ascii"))
    return pa.array(text, pa.string()), pa.array(b64, pa.string())


def dead_letters(msgs: list[Any], values: list[bytes | None], bad: list[tuple[int, str]]) -> pa.RecordBatch:
    """The ``dead_letters`` rows of the bad records ``(index, error)`` (bad records are rare: per record)."""
    picked = [msgs[i] for i, _ in bad]
    raw_values = [values[i] for i, _ in bad]
    key_text, key_b64 = _text_or_base64([m.key() for m in picked])
    value_text, value_b64 = _text_or_base64(raw_values)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.topic() for m in picked], pa.string()),
            pa.array([m.partition() for m in picked], pa.int32()),
            pa.array([m.offset() for m in picked], pa.int64()),
            timestamps(message_timestamps(picked)) if picked else pa.array([], _TS),
            key_text,
            key_b64,
            value_text,
            value_b64,
            pa.array([None if v is None else len(v) for v in raw_values], pa.int64()),
            pa.array([e for _, e in bad], pa.string()),
        ],
        schema=DEAD_LETTER_SCHEMA,
    )


def route_bad_records(
    source: KafkaSource, ctx: ReaderContext, decoded: Decoded, msgs: list[Any], values: list[bytes | None], output: ReaderOutput
) -> None:
    """Count tombstones and bad records; fail on the first bad one (``on_bad_record="fail"``: a
    BadRecordError naming topic, partition and offset) or emit them all as dead letters."""
    if decoded.tombstones:
        ctx.metric("tombstones", decoded.tombstones)
    if not decoded.bad:
        return
    ctx.metric("bad_records", len(decoded.bad))
    if source.on_bad_record == "fail":
        i, err = decoded.bad[0]
        m = msgs[i]
        raise BadRecordError(
            f"KafkaSource {source.name!r}: cannot decode a record as {source.format}: {err}",
            topic=m.topic() or "",
            partition=m.partition() or 0,
            offset=m.offset() or 0,
            snippet=values[i] or b"",
        )
    output.emit_side(DEAD_LETTERS, dead_letters(msgs, values, decoded.bad))
