"""The Confluent wire format (magic byte, schema id, payload), shared by the Avro and JSON Schema formats.

A batch is split by schema id (vectorized, :func:`~.schema_registry.split_wire_format`);
each id's records are decoded together and the parts are aligned to **one Arrow schema per batch**:

* Avro: the reader schema is ``avro_schema`` if given, else the newest writer schema seen (the highest id):
  records of older ids are resolved to it by Avro's rules (defaults, promotions), so the output changes
  only when a new version appears. An id whose schema cannot be resolved to the reader schema
  (incompatible change) makes its records bad records.
* JSON Schema: each id's schema maps to Arrow; the stream's schema is the widening of all ids seen
  (:mod:`.schemas`); an id whose schema does not widen makes its records bad records.

Unknown ids (HTTP 404 from the registry), values without the magic byte, schemas of another type and
undecodable payloads are bad records too (``on_bad_record``), each with a message naming the cause. An
unreachable registry fails the job (:class:`~sluice.connectors.kafka.errors.SchemaRegistryError`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
from sluice.connectors.kafka.errors import SchemaNotFoundError, UnsupportedSchemaError
from sluice.connectors.kafka.formats.avro_columnar import PAD
from sluice.connectors.kafka.formats.base import Decoded, ValueDecoder
from sluice.connectors.kafka.formats.schema_registry import SchemaRegistryClient, split_wire_format
from sluice.connectors.kafka.formats.schemas import align

__all__ = ["Part", "Payloads", "WireDecoder"]

_PADDING = bytes(PAD)
_NOT_WIRE = (
    "not in the Confluent wire format (magic byte 0 and a 4-byte schema id): was it written without a "
    "schema-registry serializer?"
)
Part = tuple[pa.RecordBatch, np.ndarray]
Payloads = Callable[[np.ndarray | None], list[bytes]]


class WireDecoder(ValueDecoder):
    """Splits a batch by schema id, decodes each id's records, aligns the parts to one schema."""

    def __init__(self, registry: SchemaRegistryClient | None, output: pa.Schema | None) -> None:
        self.registry = registry
        self.output = output
        self.schema = output
        self._writers: dict[int, Any] = {}

    @property
    def writers(self) -> dict[int, Any]:
        """The compiled schema of each id met so far (a copy; the native reader's table is made from it)."""
        return dict(self._writers)

    def _writer(self, schema_id: int) -> Any:
        """The compiled schema of ``schema_id`` (cached); raises for ids that make records bad."""
        found = self._writers.get(schema_id)
        if found is None:
            assert self.registry is not None
            registered = self.registry.schema(schema_id)
            if registered.references:
                raise UnsupportedSchemaError(
                    f"schema id {schema_id} references other schemas, which sluice does not resolve yet"
                )
            found = self._writers[schema_id] = self._compile(
                schema_id, registered.schema_type, registered.schema
            )
        return found

    @abstractmethod
    def _compile(self, schema_id: int, schema_type: str, text: str) -> Any:
        """Compile a registered schema; UnsupportedSchemaError if it has the wrong type or no Arrow form."""

    @abstractmethod
    def _prepare(self, writers: dict[int, Any], bad: dict[int, str]) -> None:
        """Pick the batch's target before its groups decode; may move ids from ``writers`` to ``bad``."""

    @abstractmethod
    def _group(
        self, writer: Any, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, payloads: Payloads
    ) -> tuple[list[Part], list[tuple[int, str]]]:
        """Decode one id's records: parts with rows local to the group, and bad (local index, error).
        ``payloads(sel)`` gives the payload bytes of the group's records ``sel`` (None: all)."""

    @abstractmethod
    def _target(self) -> pa.Schema:
        """The schema every part is aligned to."""

    def _decode(self, values: list[bytes]) -> Decoded:
        lens = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
        starts = np.zeros(len(values), dtype=np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        ends = starts + lens
        buf = np.frombuffer(b"".join([*values, _PADDING]), dtype=np.uint8)
        bad: list[tuple[int, str]] = []
        if self.registry is not None:
            ids, ok = split_wire_format(values)
            bad.extend((int(i), _NOT_WIRE) for i in np.flatnonzero(~ok))
            starts = starts + 5
        else:
            ids, ok = np.zeros(len(values), dtype=np.int64), np.ones(len(values), dtype=bool)
        writers: dict[int, Any] = {}
        failed: dict[int, str] = {}
        for sid in np.unique(ids[ok]).tolist():
            try:
                writers[sid] = self._writer(sid) if self.registry is not None else None
            except (SchemaNotFoundError, UnsupportedSchemaError) as exc:
                failed[sid] = str(exc)
        self._prepare(writers, failed)
        parts: list[Part] = []
        for sid in np.unique(ids[ok]).tolist():
            idx = np.flatnonzero(ok & (ids == sid))
            if sid in failed:
                bad.extend((int(i), failed[sid]) for i in idx)
                continue
            off = 5 if self.registry is not None else 0

            def payloads(sel: np.ndarray | None, idx: np.ndarray = idx, off: int = off) -> list[bytes]:
                picked = idx if sel is None else idx[sel]
                return [values[i][off:] for i in picked.tolist()]

            got, group_bad = self._group(writers[sid], buf, starts[idx], ends[idx], payloads)
            parts.extend((b, idx[r]) for b, r in got if b.num_rows)
            bad.extend((int(idx[i]), e) for i, e in group_bad)
        bad.sort()
        if not parts:
            return Decoded(None, np.zeros(0, dtype=np.int64), bad)
        target = self._target()
        rows = np.concatenate([r for _, r in parts])
        table = pa.Table.from_batches([align(b, target) for b, _ in parts], schema=target)
        if len(parts) > 1:
            order = np.argsort(rows, kind="stable")
            table, rows = table.take(order), rows[order]
        batch = table.combine_chunks().to_batches()[0]
        if self.output is not None:
            batch = align(batch, self.output)
        full = rows.size == len(values) and not bad
        return Decoded(batch, None if full else rows, bad)
