"""What the shared table writer and compactor need of an Iceberg table (:class:`IcebergFormat`, a
:class:`~sluice.sinks.tables.writer.TableFormat`), made from the sink's options."""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from sluice.sinks.iceberg.catalog import check_schema, check_spec, open_or_create
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
            if not check_schema(self.options, table, schema):
                break
            try:  # merge: new columns join the table's schema (with field ids) before any file has them
                with table.update_schema() as update:
                    update.union_by_name(schema)
            except Exception as exc:  # another writer evolved it at the same moment: look again
                log.info("%s: schema update lost a race, retrying: %s", self.options.name, exc)
            table = self.loaded(refresh=True)
        return IcebergLayout(table)

    def file_stats(self, meta: pq.FileMetaData, table: pa.Table) -> Any:
        loaded = self.loaded()
        if set(table.column_names) - {f.name for f in loaded.schema().fields}:
            loaded = self.loaded(refresh=True)  # another subtask added columns since this one loaded it
        return file_stats(loaded, meta)
