"""Apache Iceberg sink on pyiceberg: one snapshot per checkpoint, idempotent by its summary properties.

Needs the ``sluice-etl[iceberg]`` extra (``pyiceberg[sql-sqlite,pyarrow,pyiceberg-core]``); importing this package
does not load it. See ``docs/tables.md``.
"""

from __future__ import annotations

from sluice.sinks.iceberg.sink import IcebergSink
from sluice.sinks.tables import RewritePolicy, TableLineageError, TableSchemaError

__all__ = ["IcebergSink", "RewritePolicy", "TableLineageError", "TableSchemaError"]
