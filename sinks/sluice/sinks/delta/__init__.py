"""Delta Lake sink on delta-rs: one Delta transaction per checkpoint, idempotent by app transaction.

Needs the ``sluice-etl[delta]`` extra (``deltalake``); importing this package does not load it. See
``docs/tables.md``.
"""

from __future__ import annotations

from sluice.sinks.delta.sink import DeltaSink
from sluice.sinks.tables import RewritePolicy, TableLineageError, TableSchemaError

__all__ = ["DeltaSink", "RewritePolicy", "TableLineageError", "TableSchemaError"]
