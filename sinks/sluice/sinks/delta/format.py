"""What the shared table writer and compactor need of a Delta table (:class:`DeltaFormat`, a
:class:`~sluice.sinks.tables.writer.TableFormat`), made from the sink's options."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from sluice.sinks.delta.options import DeltaSinkOptions
from sluice.sinks.delta.table import DeltaLayout, check_partitioning, check_schema, delta_stats, open_table
from sluice.sinks.tables.writer import TableLayout

__all__ = ["DeltaFormat"]


class DeltaFormat:
    """Data files of a Delta table: under the table root by partition folder, partition columns left out,
    the add action's statistics."""

    def __init__(self, options: DeltaSinkOptions) -> None:
        self.options = options
        self.compression = options.compression

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        return self.options.filesystem()

    def data_path(self, partition_path: str, name: str) -> str:
        return f"{partition_path}/{name}" if partition_path else name

    def layout(self, schema: pa.Schema) -> TableLayout:
        table = open_table(self.options)
        if table is None:  # the first commit creates it (on the driver) with this schema
            check_partitioning(self.options, schema)
            return DeltaLayout(schema, self.options.partition_by)
        new = check_schema(self.options, table, schema)
        full = pa.schema([*pa.schema(table.schema().to_arrow()), *new])
        return DeltaLayout(full, table.metadata().partition_columns)

    def file_stats(self, meta: pq.FileMetaData, table: pa.Table) -> Any:
        return delta_stats(table)
