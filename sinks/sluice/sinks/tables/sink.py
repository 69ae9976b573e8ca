"""The part of the Delta Lake and Iceberg sinks' ``Sink`` SPI that does not depend on the table format:
the writer and compactor stages (:mod:`sluice.sinks.tables.writer`), fed the sink's
:class:`~sluice.sinks.tables.writer.TableFormat`, or in upsert mode the change stages
(:mod:`sluice.sinks.tables.change_writer`), and the options both sinks have."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import pyarrow as pa
from sluice.changes import OP, ORDER, keys_of
from sluice.errors import ConfigError
from sluice.serializers import SimpleVersionedSerializer
from sluice.sink import Compactor, Sink, SinkContext, SinkWriter
from sluice.sinks.options import Option
from sluice.sinks.tables.change_writer import ChangeCompactor, ChangeWriter, Storage
from sluice.sinks.tables.files import TableFile
from sluice.sinks.tables.options import TableSinkOptions
from sluice.sinks.tables.rewrite import RewritePolicy
from sluice.sinks.tables.serializers import TableFileSerializer
from sluice.sinks.tables.writer import TableCompactor, TableFormat, TableWriter

__all__ = ["TableSink"]


class TableSink(Sink[TableFile]):
    """Base of the table sinks: writers stage Parquet data files at pre-commit, a compactor stage keyed by
    partition merges them when ``compaction`` is on, one global commit per checkpoint publishes them.

    A subclass builds its options (a frozen :class:`~sluice.sinks.tables.options.TableSinkOptions`, checked
    there; each option is also an attribute of the sink) in ``__init__`` and provides :meth:`table_format`
    (what the shared writer and compactor need of the table, made from the options) and the global committer.
    """

    global_commit = True
    options: TableSinkOptions

    partition_by = Option[list[str]]()
    schema = Option[pa.Schema | None]("table_schema")
    schema_mode = Option[str]()
    storage_options = Option[dict[str, Any]]()
    compaction = Option[bool]()
    rewrite = Option[RewritePolicy | None]()
    compression = Option[str]()
    mode = Option[str]()
    key_columns = Option[list[str]]()
    name = Option[str]()

    @abstractmethod
    def table_format(self) -> TableFormat:
        """The table as the writers and compactors of one subtask see it (made from the options)."""

    @abstractmethod
    def change_storage(self) -> Storage:
        """Upsert mode: where the writers stage change files (the table's location; the table may be created
        from the changes' row columns)."""

    @property
    def upserts(self) -> bool:
        """Whether the sink merges change batches by key (``mode="upsert"``)."""
        return self.options.mode == "upsert"

    def row_schema(self, schema: pa.Schema) -> pa.Schema:
        """At build time: ``schema`` itself (append mode), or, in upsert mode, its row columns after checking
        the key columns are in it (ConfigError naming ``key_columns`` otherwise). An upsert stream is a change
        stream (:mod:`sluice.changes`: deletes too) or plain rows (each row an upsert of its key)."""
        if not self.upserts:
            return schema
        kind = type(self).__name__
        keys = self.options.key_columns or list(keys_of(schema))
        changes = OP in schema.names or ORDER in schema.names
        if not keys:
            raise ConfigError(
                f"{kind}: mode='upsert' needs key_columns=[...] (the columns that identify a row), or a change "
                f"format that names them in the stream's schema (columns: {schema.names})"
            )
        missing = [c for c in (*keys, *((OP, ORDER) if changes else ())) if c not in schema.names]
        if missing:
            what = f"change batches with the key column(s) {keys} and {OP}, {ORDER} (sluice.changes)" if changes else (
                f"rows with the key column(s) {keys}"
            )
            raise ConfigError(f"{kind}: mode='upsert' takes {what}; the stream lacks {missing} (columns: {schema.names})")
        return pa.schema([f for f in schema if f.name not in (OP, ORDER)])

    def restore_config(self) -> dict[str, Any] | None:
        """The mode and key columns: staged upsert changes are collapsed by them."""
        return {"operator": type(self).__name__, "mode": self.options.mode, "key_columns": list(self.options.key_columns)}

    def input_key_columns(self, schema: pa.Schema | None) -> list[str] | None:
        """Upsert mode with ``key_columns``, unless the stream is known to be a change stream (whose order
        column orders each key's changes): every row of a key reaches one writer, in order, so the last row
        per key wins."""
        if not self.upserts:
            return None
        if schema is not None and OP in schema.names and ORDER in schema.names:
            return None
        keys = self.options.key_columns or (list(keys_of(schema)) if schema is not None else [])
        return list(keys) or None

    def validate(self) -> None:
        """Raise ConfigError naming the wrong option and the allowed values (the options are checked when the
        sink is built; this checks them again after an option was assigned)."""
        self.options = self.options.checked()

    @property
    def compacts(self) -> bool:  # type: ignore[override]
        return self.options.compaction

    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[TableFile]:
        if self.upserts:
            return ChangeWriter(self.change_storage(), self.options.key_columns, ctx, self.options.compression)
        return TableWriter(self.table_format(), ctx)

    def create_compactor(self, ctx: SinkContext) -> Compactor[TableFile] | None:
        if not self.options.compaction:
            return None
        if self.upserts:
            return ChangeCompactor(self.change_storage(), self.options.key_columns, ctx, self.options.compression)
        return TableCompactor(self.table_format(), ctx)

    def committable_serializer(self) -> SimpleVersionedSerializer[TableFile]:
        """Staged data files go into checkpoints as JSON (:mod:`sluice.sinks.tables.serializers`); the
        writers keep no state of their own."""
        return TableFileSerializer()
