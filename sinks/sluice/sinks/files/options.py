"""The file sink's options: one frozen model, checked when the sink is built, handed to its writers,
committers and compactor (which never see the sink itself)."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
from pydantic import Field
from sluice.errors import ConfigError
from sluice.io.s3 import S3_OPTIONS, parse_s3_uri
from sluice.sinks.files.buckets import BucketAssigner
from sluice.sinks.files.compaction import CompactionPolicy
from sluice.sinks.files.filesystem import FileSystem, LocalFileSystem
from sluice.sinks.files.formats import COMPRESSIONS, FORMATS, FormatOptions, unwritable_columns
from sluice.sinks.files.rolling import RollingPolicy
from sluice.sinks.options import SinkOptions, int_at_least, policy

__all__ = ["MIN_PART_SIZE", "FileSinkOptions"]

#: S3's minimum size of a multipart upload's part (all but the last)
MIN_PART_SIZE = 5 * 1024 * 1024
_DEFAULT_COMPRESSION = {"parquet": "snappy", "json": "none", "csv": "none"}
_PATH = "a local folder, file:// or s3://bucket/prefix"


class FileSinkOptions(SinkOptions):
    """Every option of a :class:`~sluice.sinks.files.FileSink` (documented there), checked and normalised:
    ``compression`` resolved to the format's default, ``bucket_by`` a list, ``rolling`` and ``compaction``
    policies (``compaction`` None when off)."""

    path: str
    format: str = "parquet"
    compression: str | None = None
    row_group_size: int = 1024 * 1024
    bucket_by: list[str] = Field(default_factory=list)
    time_bucket: str | None = None
    time_column: str | None = None
    rolling: RollingPolicy = Field(default_factory=RollingPolicy)
    compaction: CompactionPolicy | None = None
    schema_evolution: bool = False
    storage_options: dict[str, Any] = Field(default_factory=dict, repr=False)  # may hold credentials
    multipart_threshold: int = 16 * 1024 * 1024
    part_size: int = 16 * 1024 * 1024
    local_tmp_dir: str | None = None
    name: str = "file-sink"

    @classmethod
    def check(cls, values: dict[str, Any]) -> dict[str, Any]:
        v = values
        path = v["path"]
        if not isinstance(path, str) or not path:
            raise ConfigError(f"FileSink: path must be {_PATH} (got {path!r})")
        if isinstance(v["local_tmp_dir"], os.PathLike):
            v["local_tmp_dir"] = os.fspath(v["local_tmp_dir"])
        if v["compression"] is None:
            v["compression"] = _DEFAULT_COMPRESSION.get(v["format"], "none")
        bucket_by = v["bucket_by"]
        v["bucket_by"] = [bucket_by] if isinstance(bucket_by, str) else list(bucket_by)
        v["rolling"] = RollingPolicy() if v["rolling"] is None else policy(v["rolling"], RollingPolicy, "FileSink", "rolling")
        compaction = CompactionPolicy() if v["compaction"] is True else v["compaction"]
        v["compaction"] = (
            None
            if compaction is None or compaction is False
            else policy(compaction, CompactionPolicy, "FileSink", "compaction")
        )
        if v["format"] not in FORMATS:
            raise ConfigError(f"FileSink: format must be one of {', '.join(FORMATS)} (got {v['format']!r})")
        allowed = COMPRESSIONS[v["format"]]
        if v["compression"] not in allowed:
            raise ConfigError(
                f"FileSink: compression for format {v['format']!r} must be one of "
                f"{', '.join(allowed)} (got {v['compression']!r})"
            )
        for opt in ("row_group_size", "multipart_threshold", "part_size"):
            int_at_least("FileSink", opt, v[opt], 1)
        if v["part_size"] < MIN_PART_SIZE:
            raise ConfigError(
                f"FileSink: part_size must be >= {MIN_PART_SIZE} bytes (S3's minimum part size; "
                f"got {v['part_size']})"
            )
        if not isinstance(v["schema_evolution"], bool):
            raise ConfigError(f"FileSink: schema_evolution must be True or False (got {v['schema_evolution']!r})")
        if "://" in path and not path.startswith(("s3://", "file://")):
            raise ConfigError(f"FileSink: path must be {_PATH} (got {path!r})")
        if path.startswith("s3://"):
            parse_s3_uri(path)
            unknown = sorted(set(v["storage_options"]) - set(S3_OPTIONS))
            if unknown:
                raise ConfigError(
                    f"FileSink: storage_options has unknown option(s) {unknown} (allowed: {', '.join(S3_OPTIONS)})"
                )
        v["rolling"].validate()
        if v["compaction"] is not None:
            v["compaction"].validate()
        BucketAssigner(v["bucket_by"], v["time_bucket"], v["time_column"]).validate()
        return v

    # -- the parts the sink's writers, committers and compactor are made of ----------------------------
    def filesystem(self) -> FileSystem:
        """A new FileSystem for the sink's root (one per writer / committer: clients are not shared)."""
        if self.path.startswith("s3://"):
            from sluice.sinks.files.s3filesystem import S3FileSystem

            return S3FileSystem(
                self.path, self.storage_options, self.multipart_threshold, self.part_size, self.local_tmp_dir
            )
        return LocalFileSystem(self.path)

    def format_options(self) -> FormatOptions:
        """How files are encoded."""
        return FormatOptions(self.format, self.compression or "none", self.row_group_size)

    def bucket_assigner(self) -> BucketAssigner:
        """Which bucket (folder) each row goes to."""
        return BucketAssigner(self.bucket_by, self.time_bucket, self.time_column)

    def check_schema(self, schema: pa.Schema) -> None:
        """Refuse a column the format cannot write, naming the sink and the column."""
        bad = unwritable_columns(schema, self.format)
        if bad:
            f = bad[0]
            raise ConfigError(
                f"FileSink {self.path!r}: column {f.name!r} has type {f.type}, which format {self.format!r} "
                "cannot write: drop or convert it upstream (map_batches), or use format 'parquet' or 'json'"
            )
