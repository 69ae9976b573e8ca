"""What the shared table writer and compactor need of an Iceberg table (:class:`IcebergFormat`, a
:class:`~sluice.sinks.tables.writer.TableFormat`), made from the sink's options."""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from sluice.errors import CommitError
from sluice.sinks.iceberg.catalog import check_schema, check_spec, open_or_create
from sluice.sinks.iceberg.evolve import add_pending_columns, file_field_ids, schema_of_ids, writer_schema
from sluice.sinks.iceberg.layout import IcebergLayout, file_stats
from sluice.sinks.iceberg.options import IcebergSinkOptions
from sluice.sinks.tables.storage import arrow_filesystem
from sluice.sinks.tables.writer import TableLayout

__all__ = ["IcebergFormat"]

log = logging.getLogger("sluice.sinks.iceberg")


class IcebergFormat:
    """Data files of an Iceberg table: under its ``data/`` folder, every column with its field id, the
    statistics a DataFile records. Loads the table once (:meth:`loaded`) and again when asked to."""

    def __init__(self, options: IcebergSinkOptions) -> None:
        self.options = options
        self.compression = options.compression
        self._table: Any = None

    def loaded(self, schema: pa.Schema | None = None, refresh: bool = False) -> Any:
        """The table (created from ``schema`` if missing), kept for the next calls unless ``refresh``."""
        if self._table is None or refresh:
            self._table = open_or_create(self.options, schema)
        return self._table

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        return arrow_filesystem(self.loaded().location(), self.options.storage_options)

    def data_path(self, partition_path: str, name: str) -> str:
        return f"data/{partition_path}/{name}" if partition_path else f"data/{name}"

    def layout(self, schema: pa.Schema) -> TableLayout:
        table = self.loaded(schema, refresh=True)
        check_spec(self.options, table)
        for _ in range(10):
            new = check_schema(self.options, table, schema)  # new columns: schema_mode="merge" only
            file_schema, missing = writer_schema(table, new)
            if file_schema is not None:
                return IcebergLayout(table, file_schema)
            try:  # ids for the new columns, in a schema that is not current yet (sluice.sinks.iceberg.evolve)
                add_pending_columns(table, missing)
            except Exception as exc:  # another writer added a schema at the same moment: look again
                log.info("%s: adding columns lost a race, retrying: %s", self.options.name, exc)
            table = self.loaded(refresh=True)
        raise CommitError(
            f"IcebergSink {self.options.table}: could not add columns {[f.name for f in missing]} to the table's "
            "schemas in 10 tries (other writers kept changing the table)"
        )

    def file_stats(self, meta: pq.FileMetaData, table: pa.Table) -> Any:
        ids = file_field_ids(table.schema)
        schema = schema_of_ids(self.loaded(), ids)
        if schema is None:  # another subtask added the columns since this one loaded the table
            schema = schema_of_ids(self.loaded(refresh=True), ids)
        return file_stats(self.loaded(), meta, schema)
