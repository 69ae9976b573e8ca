"""Bad records: a BadRecordError naming where the first one is, or rows of the ``dead_letters`` side output."""

from __future__ import annotations

import base64
import re

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.formats import Decoded, Messages
from sluice.connectors.kafka.formats.messages import TIMESTAMP, timestamp_column
from sluice.connectors.kafka.options import DEAD_LETTERS, KafkaSourceOptions
from sluice.errors import BadRecordError
from sluice.source import ReaderContext, ReaderOutput

__all__ = ["DEAD_LETTER_SCHEMA", "dead_letters", "route_bad_records"]

#: columns of the ``dead_letters`` side output: where the record was, its key and value as UTF-8 text
#: (``*_text``) or, when they are not valid UTF-8, as base64 (``*_base64``; the other column is null then),
#: the value's size and why it is a dead letter (docs/kafka.md, "Dead letters")
DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", TIMESTAMP),
        ("key_text", pa.string()),
        ("key_base64", pa.string()),
        ("value_text", pa.string()),
        ("value_base64", pa.string()),
        ("value_bytes", pa.int64()),
        ("error", pa.string()),
    ]
)

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


def dead_letters(messages: Messages, bad: list[tuple[int, str]]) -> pa.RecordBatch:
    """The ``dead_letters`` rows of the bad records ``(index, error)`` (bad records are rare: per record)."""
    picked = messages.take(np.array([i for i, _ in bad], dtype=np.int64))
    raw_values = picked.values
    key_text, key_b64 = _text_or_base64(picked.keys())
    value_text, value_b64 = _text_or_base64(raw_values)
    return pa.RecordBatch.from_arrays(
        [
            picked.topics(),
            pa.array(picked.partitions, pa.int32()),
            pa.array(picked.offsets, pa.int64()),
            timestamp_column(picked.timestamps()),
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
    options: KafkaSourceOptions, ctx: ReaderContext, decoded: Decoded, messages: Messages, output: ReaderOutput
) -> None:
    """Count tombstones and bad records; fail on the first bad one (``on_bad_record="fail"``: a
    BadRecordError naming topic, partition and offset) or emit them all as dead letters."""
    if decoded.tombstones:
        ctx.metric("tombstones", decoded.tombstones)
    if not decoded.bad:
        return
    ctx.metric("bad_records", len(decoded.bad))
    if options.on_bad_record == "fail":
        i, err = decoded.bad[0]
        raise BadRecordError(
            f"KafkaSource {options.name!r}: cannot decode a record as {options.format_name}: {err}",
            topic=messages.topic_at(i),
            partition=int(messages.partitions[i]),
            offset=int(messages.offsets[i]),
            snippet=messages.values[i] or b"",
        )
    output.emit_side(DEAD_LETTERS, dead_letters(messages, decoded.bad))
