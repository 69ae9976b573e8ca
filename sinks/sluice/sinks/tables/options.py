"""The options the table sinks share (and check the same way); ``DeltaSinkOptions`` and
``IcebergSinkOptions`` add their own."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
from pydantic import Field
from sluice.errors import ConfigError
from sluice.sinks.options import SinkOptions
from sluice.sinks.tables.rewrite import RewritePolicy, rewrite_policy

__all__ = ["MODES", "SCHEMA_MODES", "TableSinkOptions"]

SCHEMA_MODES = ("strict", "merge")
#: ``append``: rows are appended; ``upsert``: each row (or change, :mod:`sluice.changes`) is merged by key
MODES = ("append", "upsert")


class TableSinkOptions(SinkOptions):
    """What every table sink takes: partitioning, schema handling, storage, compaction, rewrite, compression
(the sink's ``schema`` argument is ``table_schema`` here: ``schema`` is a pydantic model's method).

    A subclass names its sink (``KIND``, the prefix of every message) and the Parquet codecs it accepts
    (``COMPRESSIONS``, the default first), and checks its own options in :meth:`check_format` (before the
    shared ones) and :meth:`check_partitioning` (after them).
    """

    KIND: ClassVar[str] = "TableSink"
    COMPRESSIONS: ClassVar[tuple[str, ...]] = ()

    partition_by: list[str] = Field(default_factory=list)
    table_schema: pa.Schema | None = None
    schema_mode: str = "strict"
    storage_options: dict[str, Any] = Field(default_factory=dict, repr=False)  # may hold credentials
    compaction: bool = True
    rewrite: RewritePolicy | None = None
    compression: str = ""
    mode: str = "append"
    key_columns: list[str] = Field(default_factory=list)

    @classmethod
    def check(cls, values: dict[str, Any]) -> dict[str, Any]:
        v = values
        v["rewrite"] = rewrite_policy(v["rewrite"], cls.KIND)
        partition_by = v["partition_by"]
        v["partition_by"] = [partition_by] if isinstance(partition_by, str) else list(partition_by)
        v["storage_options"] = dict(v["storage_options"] or {})
        cls.check_format(v)
        if v["schema_mode"] not in SCHEMA_MODES:
            raise ConfigError(
                f"{cls.KIND}: schema_mode must be one of {', '.join(SCHEMA_MODES)} (got {v['schema_mode']!r})"
            )
        if v["compression"] not in cls.COMPRESSIONS:
            raise ConfigError(
                f"{cls.KIND}: compression must be one of {', '.join(cls.COMPRESSIONS)} (got {v['compression']!r})"
            )
        schema = v["table_schema"]
        if schema is not None and not isinstance(schema, pa.Schema):
            raise ConfigError(f"{cls.KIND}: schema must be a pyarrow.Schema (got {type(schema).__name__})")
        cls._check_mode(v)
        if not isinstance(v["compaction"], bool):
            raise ConfigError(f"{cls.KIND}: compaction must be True or False (got {v['compaction']!r})")
        cls.check_partitioning(v)
        return v

    @classmethod
    def _check_mode(cls, v: dict[str, Any]) -> None:
        if v["mode"] not in MODES:
            raise ConfigError(f"{cls.KIND}: mode must be one of {', '.join(MODES)} (got {v['mode']!r})")
        keys = v["key_columns"]
        keys = [keys] if isinstance(keys, str) else list(keys or ())
        if not all(isinstance(k, str) and k for k in keys) or len(set(keys)) != len(keys):
            raise ConfigError(f"{cls.KIND}: key_columns must be distinct column names (got {v['key_columns']!r})")
        if keys and v["mode"] != "upsert":
            raise ConfigError(f"{cls.KIND}: key_columns is for mode='upsert' only (got mode={v['mode']!r})")
        schema = v["table_schema"]
        if keys and isinstance(schema, pa.Schema):
            missing = [k for k in keys if k not in schema.names]
            if missing:
                raise ConfigError(f"{cls.KIND}: key_columns names column(s) {missing} not in schema ({schema.names})")
        v["key_columns"] = keys

    @classmethod
    def check_format(cls, values: dict[str, Any]) -> None:
        """The sink's own checks that come first (its library installed, where the table is)."""

    @classmethod
    def check_partitioning(cls, values: dict[str, Any]) -> None:
        """The sink's own checks that come last (partitioning against the schema, ...)."""
