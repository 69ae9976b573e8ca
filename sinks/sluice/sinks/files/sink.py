"""``FileSink``: exactly-once Parquet, JSON lines or CSV files on local disk or S3."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from sluice.errors import ConfigError, StorageError
from sluice.serializers import SimpleVersionedSerializer
from sluice.sink import Committer, Compactor, Sink, SinkContext, SinkWriter
from sluice.sinks.files.committable import FileCommittable
from sluice.sinks.files.committer import FileCommitter
from sluice.sinks.files.compaction import CompactionPolicy, FileCompactor
from sluice.sinks.files.options import FileSinkOptions
from sluice.sinks.files.rolling import RollingPolicy
from sluice.sinks.files.serializers import FileCommittableSerializer, FileWriterStateSerializer
from sluice.sinks.files.writer import FileSinkWriter
from sluice.sinks.options import Option

__all__ = ["FileSink"]

log = logging.getLogger("sluice.sinks.files")


class FileSink(Sink[FileCommittable]):
    """Files that become visible exactly once, when the checkpoint that staged them completes.

    Lifecycle: in-progress (hidden) -> pending at pre-commit (hidden, durable, named in the checkpoint) ->
    visible under ``part-<job>-<checkpoint>-<subtask>-<seq>-<run><ext>`` when the checkpoint completes. See
    ``docs/file-sink.md``.

    The arguments are checked when the sink is built and kept as ``options``, a frozen
    :class:`~sluice.sinks.files.options.FileSinkOptions` that the writers, committers and compactor are
    handed; each option is also an attribute of the sink.

    Args:
        path: a local folder, ``file://`` URI or ``s3://bucket/prefix``.
        format: ``"parquet"``, ``"json"`` (JSON lines) or ``"csv"``.
        compression: Parquet: snappy, zstd, gzip, brotli, lz4, none (default snappy); JSON / CSV: none or
            gzip (default none).
        row_group_size: Parquet rows per row group.
        bucket_by: columns whose values name Hive-style ``col=value/`` folders (the columns are not written
            into the files, as with Spark's ``partitionBy``).
        time_bucket: strftime pattern of time folders after the column folders, e.g. ``"dt=%Y-%m-%d/hour=%H"``
            (UTC).
        time_column: event-time column for ``time_bucket`` (epoch ms or a timestamp); None = processing time.
        rolling: a RollingPolicy (or dict): roll on size, age, inactivity; always at each checkpoint.
        compaction: a CompactionPolicy (or dict, or True for the defaults) to merge small files; None = off.
        schema_evolution: on a schema change within a bucket, start a new file instead of failing.
        storage_options: for ``s3://``: boto3 client options (endpoint_url, region_name, credentials,
            profile_name, max_attempts); unset ones come from the standard AWS chain. The same name as
            ``CheckpointConfig.storage_options``.
        s3_options: deprecated alias of ``storage_options``.
        multipart_threshold: S3: files of at least this many bytes are multipart uploads completed at commit;
            smaller ones are put under a hidden key and copied at commit.
        part_size: S3 multipart part size in bytes (>= 5 MiB).
        local_tmp_dir: S3: local folder for in-progress files (default: the system temp folder).
        name: the sink operator's name.
    """


    path = Option[str]()
    format = Option[str]()
    compression = Option[str]()
    row_group_size = Option[int]()
    bucket_by = Option[list[str]]()
    time_bucket = Option[str | None]()
    time_column = Option[str | None]()
    rolling = Option[RollingPolicy]()
    compaction = Option[CompactionPolicy | None]()
    schema_evolution = Option[bool]()
    storage_options = Option[dict[str, Any]]()
    multipart_threshold = Option[int]()
    part_size = Option[int]()
    local_tmp_dir = Option[str | None]()
    name = Option[str]()

    def __init__(
        self,
        path: str,
        format: str = "parquet",
        *,
        compression: str | None = None,
        row_group_size: int = 1024 * 1024,
        bucket_by: Sequence[str] = (),
        time_bucket: str | None = None,
        time_column: str | None = None,
        rolling: RollingPolicy | dict[str, Any] | None = None,
        compaction: CompactionPolicy | dict[str, Any] | bool | None = None,
        schema_evolution: bool = False,
        storage_options: dict[str, Any] | None = None,
        s3_options: dict[str, Any] | None = None,
        multipart_threshold: int = 16 * 1024 * 1024,
        part_size: int = 16 * 1024 * 1024,
        local_tmp_dir: str | None = None,
        name: str = "file-sink",
    ) -> None:
        if s3_options is not None:
            if storage_options is not None:
                raise ConfigError("FileSink: give storage_options, not also its deprecated alias s3_options")
            warnings.warn(
                "FileSink(s3_options=...) is deprecated: use storage_options", DeprecationWarning, stacklevel=2
            )
        self.options = FileSinkOptions.of(
            path=path,
            format=format,
            compression=compression,
            row_group_size=row_group_size,
            bucket_by=bucket_by,
            time_bucket=time_bucket,
            time_column=time_column,
            rolling=rolling,
            compaction=compaction,
            schema_evolution=schema_evolution,
            storage_options=dict(storage_options if storage_options is not None else s3_options or {}),
            multipart_threshold=multipart_threshold,
            part_size=part_size,
            local_tmp_dir=local_tmp_dir,
            name=name,
        )

    def __repr__(self) -> str:  # never shows credentials
        return f"FileSink({self.path!r}, format={self.format!r}, compression={self.compression!r})"

    def validate(self) -> None:
        """Raise ConfigError naming the wrong option and the allowed values (the options are checked when the
        sink is built; this checks them again after an option was assigned)."""
        self.options = self.options.checked()

    def validate_schema(self, schema: pa.Schema) -> None:
        """Refuse a column this sink's format cannot write, naming the sink and the column."""
        self.options.check_schema(schema)

    # -- Sink SPI --------------------------------------------------------------------------------------
    def create_writer(self, ctx: SinkContext, restored: list[Any]) -> SinkWriter[FileCommittable]:
        return FileSinkWriter(self.options, ctx, restored)

    def create_committer(self, ctx: SinkContext) -> Committer[FileCommittable] | None:
        return FileCommitter(self.options, ctx)

    def committable_serializer(self) -> SimpleVersionedSerializer[FileCommittable]:
        """Committables go into checkpoints as JSON (:mod:`sluice.sinks.files.serializers`)."""
        return FileCommittableSerializer()

    def writer_state_serializer(self) -> SimpleVersionedSerializer[Any]:
        """The writers' held files go into checkpoints as JSON."""
        return FileWriterStateSerializer()

    @property
    def compacts(self) -> bool:  # type: ignore[override]
        """With a compaction policy, a compactor stage keyed by bucket merges the files of all writers."""
        return self.compaction is not None

    def create_compactor(self, ctx: SinkContext) -> Compactor[FileCommittable] | None:
        policy = self.compaction
        if policy is None:
            return None
        return FileCompactor(policy, self.options.filesystem(), self.options.format_options(), ctx)

    def committed_checkpoint(self, job_id: str, sink_uid: str) -> int | None:
        """The newest checkpoint of ``job_id`` whose files are visible under the sink's root: their names
        are the lineage record (``docs/file-sink.md``). One listing of the root, as :meth:`recover` does."""
        fs = self.options.filesystem()
        try:
            return fs.committed_checkpoint(job_id)
        finally:
            fs.close()

    def probe(self) -> None:
        """At job start: write and delete a hidden file under ``path`` (the folder is created if missing)."""
        s3 = self.path.startswith("s3://")
        try:
            fs = self.options.filesystem()
            try:
                fs.probe()
            finally:
                fs.close()
        except Exception as exc:
            fix = (
                "fix the path, the bucket, or the credentials and endpoint (storage_options, the AWS chain)"
                if s3
                else "fix the path or its permissions"
            )
            raise StorageError(
                f"FileSink path {self.path!r} is not writable: {type(exc).__name__}: {exc} ({fix})",
                operation="probe",
                bucket=self.path,
                code=str(getattr(exc, "code", "")),
            ) from exc

    def recover(self, job_id: str, committables: Sequence[FileCommittable]) -> None:
        """Delete staged files and abort multipart uploads of ``job_id`` that the restored checkpoint does not
        name: in-progress files, pending files of checkpoints that never completed, half-done compactions."""
        keep: set[str] = set()
        for c in committables:
            keep.add(c.staged)
            keep.update(c.replaces)
            if c.upload_id is not None:
                keep.add(c.upload_id)
        fs = self.options.filesystem()
        try:
            n = fs.cleanup(job_id, keep)
        finally:
            fs.close()
        if n:
            log.info(
                "%s: recover removed %d staged file(s) of unfinished checkpoints of job %s",
                self.name,
                n,
                job_id,
            )
