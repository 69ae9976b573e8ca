"""Key selectors: which column(s) of a batch form the key of ``key_by``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.errors import ConfigError
from sluice.state.keycodec import epoch_micros, null_mask
from sluice.state.keygroups import hash_columns

__all__ = ["KeySelector"]

KeySpec = str | Sequence[str] | Callable[[pa.RecordBatch], pa.Array]


def _state_key_type(t: pa.DataType) -> bool:
    """Whether keyed state stores keys of Arrow type ``t`` (:mod:`sluice.state.keycodec`)."""
    if pa.types.is_dictionary(t):
        return _state_key_type(t.value_type)
    return bool(
        pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
        or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t) or pa.types.is_date(t) or pa.types.is_timestamp(t)
        or pa.types.is_null(t)
    )  # fmt: skip


def _as_microseconds(column: pa.Array) -> pa.Array:
    """A nanosecond timestamp column as microseconds, floored as its keys are in state
    (:func:`~sluice.state.keycodec.epoch_micros`): a Python datetime, the key a function gets, holds no
    nanoseconds (pyarrow cannot make one of a value that is not a whole microsecond without pandas)."""
    t = column.type
    if not (pa.types.is_timestamp(t) and t.unit == "ns"):
        return column
    nulls = null_mask(column) if column.null_count else None
    return pa.array(epoch_micros(column), pa.int64(), mask=nulls).cast(pa.timestamp("us", t.tz))


class KeySelector:
    """Extracts keys from batches: a column name, several column names, or ``fn(batch) -> Array``."""

    def __init__(self, spec: KeySpec) -> None:
        if isinstance(spec, str):
            self._columns: list[str] | None = [spec]
            self._fn = None
        elif callable(spec):
            self._columns = None
            self._fn = spec
        elif isinstance(spec, Sequence) and spec and all(isinstance(c, str) for c in spec):
            self._columns = list(spec)
            self._fn = None
        else:
            raise ConfigError(
                "key_by: key must be a column name, a list of column names, or fn(batch) -> Array"
            )
        self.description = ",".join(self._columns) if self._columns else getattr(spec, "__name__", "fn")

    def check_state_key(self, schema: pa.Schema | None) -> None:
        """Refuse, at build time, key columns whose type keyed state cannot store (where the stream's schema
        is known; otherwise the first key of such a type fails the job with the same one-line error).

        Raises:
            ConfigError: naming the column, its type and the types allowed.
        """
        if schema is None or self._columns is None:
            return
        for name in self._columns:
            idx = schema.get_field_index(name)
            if idx < 0:
                continue
            t = schema.field(idx).type
            if not _state_key_type(t):
                raise ConfigError(
                    f"key_by: column {name!r} has type {t}, which keyed state cannot store as a key: key by a "
                    "column of int, float, bool, string, binary, date or timestamp type (cast it first, e.g. "
                    "a decimal to string)"
                )

    def arrays(self, batch: pa.RecordBatch) -> list[pa.Array]:
        if self._fn is not None:
            arr = self._fn(batch)
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            if not isinstance(arr, pa.Array):
                arr = pa.array(arr)
            return [arr]
        assert self._columns is not None
        try:
            return [batch.column(c) for c in self._columns]
        except KeyError:
            raise ConfigError(
                f"key_by: column(s) {self._columns} not all in the batch (columns: {batch.schema.names})"
            ) from None

    def hashes(self, batch: pa.RecordBatch) -> np.ndarray:
        """Stable hash of each row's key."""
        return hash_columns(self.arrays(batch))

    def groups(self, batch: pa.RecordBatch) -> tuple[list[Any], list[np.ndarray], np.ndarray]:
        """Rows grouped by key, in order of first appearance.

        Returns (keys, row indices of each key in input order, hash of each key).
        """
        arrays = [_as_microseconds(a) for a in self.arrays(batch)]
        if len(arrays) == 1:
            enc = pc.dictionary_encode(arrays[0])
            keys = enc.dictionary.to_pylist()
            codes = enc.indices.to_numpy(zero_copy_only=False)
            if enc.indices.null_count:
                keys.append(None)
                codes = np.where(np.isnan(codes), len(keys) - 1, codes).astype(np.int64)
            key_hashes = hash_columns([enc.dictionary]) if len(enc.dictionary) else np.zeros(0, np.uint64)
            if enc.indices.null_count:
                key_hashes = np.append(key_hashes, np.uint64(0))
        else:
            rows = list(zip(*(a.to_pylist() for a in arrays), strict=True))
            index: dict[Any, int] = {}
            codes = np.fromiter(
                (index.setdefault(r, len(index)) for r in rows), dtype=np.int64, count=len(rows)
            )
            keys = list(index)
            key_hashes = hash_columns([pa.array([k[i] for k in keys]) for i in range(len(arrays))])
        order = np.argsort(codes, kind="stable")
        bounds = np.flatnonzero(np.diff(codes[order])) + 1
        chunks = np.split(order, bounds) if len(order) else []
        present = [int(codes[c[0]]) for c in chunks]
        first_seen: Any = np.argsort([c[0] for c in chunks], kind="stable") if chunks else []
        return (
            [keys[present[i]] for i in first_seen],
            [chunks[i] for i in first_seen],
            np.array([key_hashes[present[i]] for i in first_seen], dtype=np.uint64),
        )
