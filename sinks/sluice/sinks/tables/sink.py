"""The part of the Delta Lake and Iceberg sinks' ``Sink`` SPI that does not depend on the table format:
the writer and compactor stages (:mod:`sluice.sinks.tables.writer`) and the options both sinks check the
same way."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from sluice.errors import ConfigError
from sluice.serializers import SimpleVersionedSerializer
from sluice.sink import Compactor, Sink, SinkContext, SinkWriter
from sluice.sinks.tables.files import TableFile
from sluice.sinks.tables.serializers import TableFileSerializer
from sluice.sinks.tables.writer import TableCompactor, TableWriter

__all__ = ["SCHEMA_MODES", "TableSink"]

SCHEMA_MODES = ("strict", "merge")


class TableSink(Sink[TableFile]):
    """Base of the table sinks: writers stage Parquet data files at pre-commit, a compactor stage keyed by
    partition merges them when ``compaction`` is on, one global commit per checkpoint publishes them.

    A subclass sets ``schema``, ``schema_mode``, ``compression`` and ``compaction`` and provides what
    :class:`~sluice.sinks.tables.writer.TableWriter` asks of it (``filesystem``, ``data_path``, ``layout``,
    ``file_stats``) and the global committer.
    """

    global_commit = True
    #: Parquet codecs the sink accepts, the default first
    COMPRESSIONS: tuple[str, ...] = ()
    schema: pa.Schema | None
    schema_mode: str
    compression: str
    compaction: bool

    def validate_table_options(self) -> None:
        """Check the options every table sink has; ConfigError naming the option and the allowed values."""
        kind = type(self).__name__
        if self.schema_mode not in SCHEMA_MODES:
            raise ConfigError(
                f"{kind}: schema_mode must be one of {', '.join(SCHEMA_MODES)} (got {self.schema_mode!r})"
            )
        if self.compression not in self.COMPRESSIONS:
            raise ConfigError(
                f"{kind}: compression must be one of {', '.join(self.COMPRESSIONS)} (got {self.compression!r})"
            )
        if self.schema is not None and not isinstance(self.schema, pa.Schema):
            raise ConfigError(f"{kind}: schema must be a pyarrow.Schema (got {type(self.schema).__name__})")
        if not isinstance(self.compaction, bool):
            raise ConfigError(f"{kind}: compaction must be True or False (got {self.compaction!r})")

    @property
    def compacts(self) -> bool:  # type: ignore[override]
        return self.compaction

    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[TableFile]:
        return TableWriter(self, ctx)  # type: ignore[arg-type]

    def create_compactor(self, ctx: SinkContext) -> Compactor[TableFile] | None:
        return TableCompactor(self, ctx) if self.compaction else None  # type: ignore[arg-type]

    def committable_serializer(self) -> SimpleVersionedSerializer[TableFile]:
        """Staged data files go into checkpoints as JSON (:mod:`sluice.sinks.tables.serializers`); the
        writers keep no state of their own."""
        return TableFileSerializer()
