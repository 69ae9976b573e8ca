"""What a Kafka format is: a decoder of message batches into Arrow, and a registry entry naming it.

The decoder protocol (what ``format=`` takes besides a name) is :class:`Decoder`: one method,
``decode_messages(Messages) -> Decoded``. The bad-record contract: a message that cannot be decoded is
never raised as an exception and never dropped; it goes into ``Decoded.bad`` as ``(index, error text)``,
and the source fails with a BadRecordError naming its topic, partition and offset or sends it to the
``dead_letters`` side output (``on_bad_record``). Raise only for what is not one record's fault (an
unreachable schema registry): that fails the job and the restart strategy applies. Every message is a
source of rows (``Decoded.rows``), a bad record, or counted in ``Decoded.tombstones``.

Formats that look at the values alone derive from :class:`ValueDecoder` (null values skipped and counted,
values over ``max_record_bytes`` made bad records before any parser sees them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.errors import IncompatibleSchemaError
from sluice.connectors.kafka.formats.messages import Messages
from sluice.connectors.kafka.formats.schema_registry import SchemaRegistry

__all__ = [
    "DECODE_ERRORS",
    "Decoded",
    "Decoder",
    "Format",
    "FormatOptions",
    "RowCountError",
    "ValueDecoder",
    "error_text",
    "to_batch",
]


class RowCountError(ValueError):
    """A batch parsed into another number of rows than it had values (embedded or missing separators)."""


#: what a parser raises for values it cannot decode
DECODE_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, RowCountError)


@dataclass
class Decoded:
    """The result of decoding a batch of messages.

    Attributes:
        batch: the decoded rows (None if no message decoded).
        rows: for each row of ``batch``, the index of the message it came from (one row per message, in
            order); None means every message, in order.
        bad: ``(index, error)`` of every message that could not be decoded.
        tombstones: number of messages skipped on purpose (null values).
    """

    batch: pa.RecordBatch | None
    rows: np.ndarray | None = None
    bad: list[tuple[int, str]] = field(default_factory=list)
    tombstones: int = 0


@runtime_checkable
class Decoder(Protocol):
    """Decodes batches of Kafka messages into Arrow (see the module docstring for the bad-record contract).

    A decoder given as ``format=`` is copied (``copy.deepcopy``) for each reader, which calls it from one
    thread at a time, so it may keep state (a schema it learnt) without locks.
    """

    def decode_messages(self, messages: Messages) -> Decoded:
        """Decode ``messages``; indices in the result refer to them."""
        ...


class ValueDecoder(ABC):
    """Decodes message values of one format; ``schema`` is the schema of the batches it returns so far.

    A value longer than ``max_record_bytes`` is a bad record before any parser sees it.
    """

    schema: pa.Schema | None
    #: the longest value decoded (None: no limit)
    max_record_bytes: int | None = None

    def decode_messages(self, messages: Messages) -> Decoded:
        """:meth:`decode` the messages' values."""
        return self.decode(messages.values, messages.nbytes)

    def decode(self, values: list[bytes | None], nbytes: int | None = None) -> Decoded:
        """Decode ``values``, skipping (and counting) null values; ``nbytes``, their total length if
        known, spares the length check of batches that cannot hold a value over the limit."""
        limit = self.max_record_bytes
        too_long: list[tuple[int, str]] = []
        if limit is not None and (nbytes is None or nbytes > limit) and _longest(values) > limit:
            too_long = [
                (i, _too_long(len(v), limit)) for i, v in enumerate(values) if v is not None and len(v) > limit
            ]
        if None not in values and not too_long:
            return self._decode(values)  # type: ignore[arg-type]
        skip = {i for i, _ in too_long}
        keep = [i for i, v in enumerate(values) if v is not None and i not in skip]
        kept = np.asarray(keep, dtype=np.int64)
        present: list[bytes] = [values[i] for i in keep]  # type: ignore[misc]
        tombstones = sum(1 for v in values if v is None)
        if not present:
            return Decoded(None, kept, too_long, tombstones)
        d = self._decode(present)
        rows = kept if d.rows is None else kept[d.rows]
        bad = sorted([*too_long, *((int(kept[i]), e) for i, e in d.bad)])
        return Decoded(d.batch, rows, bad, tombstones)

    @abstractmethod
    def _decode(self, values: list[bytes]) -> Decoded:
        """Decode non-null ``values``; indices in the result refer to ``values``."""

    def adopt(self, schema: pa.Schema | None) -> None:  # noqa: B027 - optional hook
        """Start from ``schema`` (inferred by the enumerator, or restored from a checkpoint)."""

    @property
    def steady_schema(self) -> pa.Schema | None:
        """The inferred schema to keep in checkpoints (None when it comes from an option or a registry)."""
        return None


class FormatOptions(Protocol):
    """The options of the Kafka source that formats read (``KafkaSourceOptions`` has them all)."""

    @property
    def format(self) -> str | Decoder: ...

    @property
    def value_schema(self) -> pa.Schema | None: ...
    @property
    def schema_registry(self) -> SchemaRegistry | None: ...
    @property
    def avro_schema(self) -> str | Mapping[str, Any] | None: ...
    @property
    def format_options(self) -> Mapping[str, Any] | None: ...
    @property
    def csv_delimiter(self) -> str: ...
    @property
    def include_metadata(self) -> bool: ...
    @property
    def event_time(self) -> str | None: ...
    @property
    def max_record_bytes(self) -> int: ...


class Format(ABC):
    """A named format: an entry of the registry :data:`sluice.connectors.kafka.formats.FORMATS`.

    Attributes:
        name: the ``format=`` name.
        takes: the options beyond ``schema`` and ``include_metadata`` this format reads
            (``"schema_registry"``, ``"avro_schema"``, ``"format_options"``); the source refuses them for
            formats that do not.
    """

    name: ClassVar[str]
    takes: ClassVar[frozenset[str]] = frozenset()

    def check(self, options: FormatOptions) -> None:  # noqa: B027 - optional hook
        """Raise ConfigError for option values this format cannot use (at build time)."""

    @abstractmethod
    def decoder(self, options: FormatOptions) -> Decoder:
        """A new decoder: one per reader, and one for the enumerator's schema sample."""

    def infers_schema(self, options: FormatOptions) -> bool:
        """Whether the schema is inferred from the data (the decoder is then a :class:`ValueDecoder` whose
        steady schema the enumerator samples and the readers keep in checkpoints)."""
        return False

    def output_schema(self, options: FormatOptions) -> pa.Schema | None:
        """The schema of the decoded batches if known at build time (metadata columns aside)."""
        return None


def _longest(values: list[bytes | None]) -> int:
    try:
        return max(map(len, values), default=0)  # type: ignore[arg-type]
    except TypeError:  # tombstones
        return max((len(v) for v in values if v is not None), default=0)


def _too_long(n: int, limit: int) -> str:
    return (
        f"the value is {n} bytes, over max_record_bytes ({limit}): raise the KafkaSource option "
        "max_record_bytes (and the brokers' message.max.bytes) to read it"
    )


def to_batch(table: pa.Table) -> pa.RecordBatch:
    """``table`` as one record batch."""
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.RecordBatch.from_pylist([], schema=table.schema)


def error_text(exc: Any) -> str:
    """A bad record's error as the dead letter and BadRecordError show it."""
    if isinstance(exc, IncompatibleSchemaError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}".strip()
