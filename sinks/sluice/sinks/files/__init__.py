"""Exactly-once file sink: Parquet, JSON lines and CSV on local disk or S3, with bucketing, rolling and
small-file compaction. See ``docs/file-sink.md``.

Example::

    stream.sink(FileSink("s3://lake/orders", format="parquet", bucket_by=["country"],
                         time_bucket="dt=%Y-%m-%d/hour=%H", time_column="ts",
                         compaction=CompactionPolicy(target_size=128 << 20)))
"""

from sluice.sinks.files.committable import FileCommittable
from sluice.sinks.files.compaction import CompactionPolicy
from sluice.sinks.files.errors import SchemaMismatchError, StorageError
from sluice.sinks.files.rolling import RollingPolicy
from sluice.sinks.files.sink import FileSink

__all__ = [
    "CompactionPolicy",
    "FileCommittable",
    "FileSink",
    "RollingPolicy",
    "SchemaMismatchError",
    "StorageError",
]
