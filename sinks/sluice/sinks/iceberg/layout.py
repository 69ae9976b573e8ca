"""Rows as Iceberg data files: cast to the table's schema (with field ids), split by the partition spec's
transforms, described by the statistics a DataFile records."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from sluice.sinks.tables.files import TableFile, split_by

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

__all__ = ["IcebergLayout", "data_file", "file_stats", "max_committed_checkpoint"]

#: snapshot summary properties of a checkpoint commit (Flink's ``flink.job-id``, ``flink.operator-id``,
#: ``flink.max-committed-checkpoint-id``)
JOB_ID = "sluice.job-id"
SINK_UID = "sluice.sink-uid"
MAX_COMMITTED = "sluice.max-committed-checkpoint-id"


class IcebergLayout:
    """Rows of one stream schema as data files of ``table`` (files keep every column of ``schema``, default
    the table's, with field ids)."""

    partition_schema = pa.schema([])

    def __init__(self, table: Table, schema: Schema | None = None) -> None:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        self.schema = schema if schema is not None else table.schema()
        self.spec = table.spec()
        self.file_schema = schema_to_pyarrow(self.schema)
        self._sources = [
            (f, self.schema.find_column_name(f.source_id), self.schema.find_type(f.source_id))
            for f in self.spec.fields
        ]

    def partitions(self, table: pa.Table) -> list[tuple[tuple[tuple[str, Any], ...], str, pa.Table]]:
        from pyiceberg.typedef import Record

        rows = self._as_stored(table)
        keys = [f.transform.pyarrow_transform(t)(rows.column(name)) for f, name, t in self._sources]
        out = []
        for values, part in split_by(rows, keys):
            path = self.spec.partition_to_path(Record(*values), self.schema) if self._sources else ""
            out.append((tuple(zip([f.name for f, _, _ in self._sources], values, strict=True)), path, part))
        return out

    def _as_stored(self, rows: pa.Table) -> pa.Table:
        cols = []
        for f in self.file_schema:
            col = rows.column(f.name) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
            cols.append(col.cast(f.type) if col.type != f.type else col)
        return pa.Table.from_arrays(cols, schema=self.file_schema)


def file_stats(table: Table, meta: pq.FileMetaData, schema: Schema | None = None) -> dict[str, Any]:
    """A data file's metrics (column sizes, value / null counts, bounds) from its Parquet footer; ``schema``:
    the file's columns (default: the table's current schema)."""
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )

    schema = schema if schema is not None else table.schema()
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=meta,
        stats_columns=compute_statistics_plan(schema, table.metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return {"spec_id": table.spec().spec_id, **stats.to_serialized_dict()}


def data_file(table: Table, f: TableFile, partition: Any = None) -> DataFile:
    """The DataFile a commit adds for ``f`` (``partition``: its partition Record, else from ``f.partition``)."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    stats = dict(f.stats)
    spec_id = stats.pop("spec_id")
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=f"{table.location().rstrip('/')}/{f.path}",
        file_format=FileFormat.PARQUET,
        partition=partition if partition is not None else Record(*(v for _, v in f.partition)),
        file_size_in_bytes=f.size,
        sort_order_id=None,
        spec_id=spec_id,
        equality_ids=None,
        key_metadata=None,
        **stats,
    )


def max_committed_checkpoint(table: Table, job_id: str, sink_uid: str | None) -> int:
    """The highest checkpoint the job (and sink, unless None) committed: walking the snapshot history from the
    current snapshot back through its parents, the first commit of the job holds it (0 if none)."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        if (
            props.get(JOB_ID) == job_id
            and (sink_uid is None or props.get(SINK_UID) == sink_uid)
            and MAX_COMMITTED in props
        ):
            return int(props[MAX_COMMITTED])
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return 0
