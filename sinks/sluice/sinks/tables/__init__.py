"""What the Delta Lake and Apache Iceberg sinks share: data files written at pre-commit, a compactor stage
keyed by partition, a background rewrite of small files, storage options, errors.

See ``docs/tables.md``.
"""

from __future__ import annotations

from sluice.sinks.tables.errors import TableLineageError, TableSchemaError
from sluice.sinks.tables.files import TableFile
from sluice.sinks.tables.rewrite import RewritePolicy

__all__ = ["RewritePolicy", "TableFile", "TableLineageError", "TableSchemaError"]
