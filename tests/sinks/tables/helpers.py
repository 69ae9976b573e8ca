"""Table sinks under test: build a DeltaSink or IcebergSink on a local folder or moto's S3, read the table
back with its own library and with an independent reader (DuckDB over the committed Parquet files, Polars),
count its versions and its files per partition."""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from sluice.sink import Sink
from sluice.sinks.delta import DeltaSink
from sluice.sinks.iceberg import IcebergSink
from sluice.sinks.tables.storage import arrow_filesystem

KINDS = ("delta", "iceberg")

os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")  # the plugin is not installed: no warning


@dataclass
class Target:
    """Where a table sink of ``kind`` writes: ``root`` (a local folder or s3://bucket/prefix)."""

    kind: str
    root: str
    storage_options: dict[str, Any]
    catalog_dir: str  # Iceberg: the local folder of the SQLite catalog

    def sink(self, **kw: Any) -> Sink[Any]:
        if self.kind == "delta":
            return DeltaSink(f"{self.root}/table", storage_options=self.storage_options, **kw)
        props = {"uri": f"sqlite:///{self.catalog_dir}/catalog.db", "warehouse": f"{self.root}/warehouse"}
        return IcebergSink("db.events", catalog_properties=props, storage_options=self.storage_options, **kw)

    # -- reading back ------------------------------------------------------------------------------------
    def exists(self) -> bool:
        if self.kind == "delta":
            from deltalake import DeltaTable
            from deltalake.exceptions import TableNotFoundError

            try:
                DeltaTable(f"{self.root}/table", storage_options=self._delta_options())
                return True
            except TableNotFoundError:
                return False
        from pyiceberg.exceptions import NoSuchTableError

        try:
            self.iceberg_table()
            return True
        except NoSuchTableError:
            return False

    def _delta_options(self) -> dict[str, str]:
        return self.sink().options.delta_storage_options()  # type: ignore[attr-defined,no-any-return]

    def delta_table(self) -> Any:
        from deltalake import DeltaTable

        return DeltaTable(f"{self.root}/table", storage_options=self._delta_options())

    def iceberg_table(self) -> Any:
        from sluice.sinks.iceberg.catalog import load_catalog

        return load_catalog(self.sink().options).load_table("db.events")  # type: ignore[attr-defined]

    def read(self) -> pa.Table:
        """What a reader of the table's current version sees (the library's own reader)."""
        if not self.exists():
            return pa.table({})
        if self.kind == "delta":
            return self.delta_table().to_pyarrow_table()
        return self.iceberg_table().scan().to_arrow()

    def files(self) -> list[str]:
        """The data files the current version references (absolute URIs)."""
        if self.kind == "delta":
            return list(self.delta_table().file_uris())
        return [t.file.file_path for t in self.iceberg_table().scan().plan_files()]

    def read_independently(self) -> pa.Table:
        """The same rows read by another engine: DuckDB over the referenced Parquet files (Delta, columns
        without the partition columns, which live in the log) or Polars (Iceberg)."""
        if self.kind == "delta":
            import duckdb

            fs, _ = arrow_filesystem(self.root, self.storage_options)
            paths = self.files()
            if not paths:
                return pa.table({})
            con = duckdb.connect()
            tables = []
            for p in paths:
                local = p.removeprefix("file://")
                if p.startswith("s3://"):
                    with fs.open_input_file(p.removeprefix("s3://")) as f:
                        data = f.read()
                    local = os.path.join(self.catalog_dir, f"dl-{len(tables)}.parquet")
                    with open(local, "wb") as out:
                        out.write(data)
                tables.append(con.sql(f"select * from read_parquet('{local}')").to_arrow_table())
            return pa.concat_tables(tables, promote_options="default")
        import polars as pl

        opts = None
        if self.root.startswith("s3://"):  # Polars reads with its own object store client
            o = self.storage_options
            opts = {
                "aws_endpoint_url": o["endpoint_url"],
                "aws_access_key_id": o["aws_access_key_id"],
                "aws_secret_access_key": o["aws_secret_access_key"],
                "aws_region": o.get("region_name", "us-east-1"),
                "aws_allow_http": "true",
            }
        return pl.scan_iceberg(self.iceberg_table(), storage_options=opts).collect().to_arrow()

    def versions(self) -> int:
        """Table versions written: Delta log entries, Iceberg snapshots."""
        if not self.exists():
            return 0
        if self.kind == "delta":
            return int(self.delta_table().version()) + 1
        return len(self.iceberg_table().snapshots())

    def rewrites(self) -> int:
        """Commits of the background rewrite (Delta ``OPTIMIZE`` entries, Iceberg ``sluice.rewrite`` snapshots)."""
        if not self.exists():
            return 0
        if self.kind == "delta":
            return sum(1 for h in self.delta_table().history() if h.get("operation") == "OPTIMIZE")
        snaps = self.iceberg_table().snapshots()
        return sum(1 for s in snaps if s.summary and "sluice.rewrite" in s.summary.additional_properties)

    def rewrote(self) -> bool:
        """Whether the background rewrite committed (a condition a source can wait for)."""
        return self.rewrites() >= 1

    def files_per_partition(self) -> collections.Counter[str]:
        return collections.Counter(f.rsplit("/", 1)[0] for f in self.files())


def ids(table: pa.Table, column: str = "id") -> list[int]:
    return sorted(table.column(column).to_pylist()) if table.num_rows else []


def completed(result: Any) -> int:
    return result.checkpoint_counts.completed
