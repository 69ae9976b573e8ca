"""The Delta sink's options: one frozen model, checked when the sink is built, handed to its writers'
table format, its committer and its rewrite (which never see the sink itself)."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow.fs as pafs
from pydantic import Field
from sluice.errors import ConfigError
from sluice.sinks.options import int_at_least
from sluice.sinks.tables.options import TableSinkOptions
from sluice.sinks.tables.storage import arrow_filesystem, delta_options, split_uri

__all__ = ["DeltaSinkOptions", "import_deltalake"]


def import_deltalake() -> Any:
    """The ``deltalake`` module, or a ConfigError naming the extra that installs it."""
    try:
        import deltalake
    except ImportError as exc:
        raise ConfigError(
            f"DeltaSink needs the deltalake package: pip install 'sluice-etl[delta]' ({exc})"
        ) from None
    return deltalake


class DeltaSinkOptions(TableSinkOptions):
    """Every option of a :class:`~sluice.sinks.delta.DeltaSink` (documented there), checked and normalised."""

    KIND: ClassVar[str] = "DeltaSink"
    COMPRESSIONS: ClassVar[tuple[str, ...]] = ("snappy", "zstd", "gzip", "lz4", "none")

    path: str
    compression: str = "snappy"
    commit_retries: int = 15
    table_name: str | None = None
    configuration: dict[str, Any] = Field(default_factory=dict)  # passed to delta-rs as given
    name: str = "delta-sink"

    @classmethod
    def check_format(cls, values: dict[str, Any]) -> None:
        import_deltalake()
        path = values["path"]
        if not isinstance(path, str) or not path:
            raise ConfigError(
                f"DeltaSink: path must be a local folder, file:// or s3://bucket/prefix (got {path!r})"
            )
        split_uri(path)
        delta_options(path, values["storage_options"])
        values["configuration"] = dict(values["configuration"] or {})

    @classmethod
    def check_partitioning(cls, values: dict[str, Any]) -> None:
        schema = values["table_schema"]
        if schema is not None:
            missing = [c for c in values["partition_by"] if c not in schema.names]
            if missing:
                raise ConfigError(
                    f"DeltaSink: partition_by names column(s) {missing} not in schema ({schema.names})"
                )
        int_at_least("DeltaSink", "commit_retries", values["commit_retries"], 0)

    def delta_storage_options(self) -> dict[str, str]:
        """Storage options in delta-rs's spelling."""
        return delta_options(self.path, self.storage_options)

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow file system and the table's root path in it."""
        return arrow_filesystem(self.path, self.storage_options)
