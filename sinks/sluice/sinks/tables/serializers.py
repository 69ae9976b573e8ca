"""How the table sinks' committables (:class:`~sluice.sinks.tables.files.TableFile`) go into checkpoints:
JSON, no pickle.

A committable is ``{"path", "size", "rows", "partition", "partition_path", "checkpoint_id", "schema",
"stats", "partition_schema"}``: the schemas as base64 Arrow IPC, the partition values and the statistics
(Delta: the add action's stats JSON; Iceberg: metrics by field id with bytes bounds) in the tagged JSON of
:func:`sluice.serializers.to_json_value`, so dates, decimals and bytes come back as they were.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from sluice.serializers import (
    JsonSerializer,
    from_json_value,
    schema_from_text,
    schema_to_text,
    to_json_value,
)
from sluice.sinks.tables.files import TableFile

__all__ = ["TableFileSerializer"]


class TableFileSerializer(JsonSerializer[TableFile]):
    """A data file staged at pre-commit, as JSON."""

    def to_json(self, obj: TableFile) -> Any:
        return {
            "path": obj.path,
            "size": obj.size,
            "rows": obj.rows,
            "partition": to_json_value(tuple(tuple(p) for p in obj.partition)),
            "partition_path": obj.partition_path,
            "checkpoint_id": obj.checkpoint_id,
            "schema": schema_to_text(obj.schema),
            "stats": to_json_value(obj.stats),
            "partition_schema": schema_to_text(obj.partition_schema),
        }

    def from_json(self, version: int, value: Any) -> TableFile:
        partition = from_json_value(value["partition"])
        if not isinstance(partition, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in partition):
            raise ValueError("a table file's partition must be (name, value) pairs")
        schema = schema_from_text(value["schema"])
        if schema is None:
            raise ValueError("a table file needs its schema")
        return TableFile(
            str(value["path"]),
            int(value["size"]),
            int(value["rows"]),
            partition,
            str(value["partition_path"]),
            int(value["checkpoint_id"]),
            schema,
            from_json_value(value["stats"]),
            schema_from_text(value["partition_schema"]) or pa.schema([]),
        )
