"""The Iceberg sink's options: one frozen model, checked when the sink is built, handed to its writers'
table format, its committer and its rewrite (which never see the sink itself)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from pydantic import Field
from sluice.errors import ConfigError
from sluice.sinks.iceberg.partitioning import parse_partition, partition_fields
from sluice.sinks.tables.options import TableSinkOptions
from sluice.sinks.tables.storage import iceberg_io_options, split_uri

__all__ = ["IcebergSinkOptions", "import_pyiceberg"]


def import_pyiceberg() -> Any:
    """The ``pyiceberg`` module, or a ConfigError naming the extra that installs it."""
    try:
        import pyiceberg.catalog
        import pyiceberg.io.pyarrow
        import pyiceberg.transforms
    except ImportError as exc:
        raise ConfigError(
            f"IcebergSink needs the pyiceberg package: pip install 'sluice-etl[iceberg]' ({exc})"
        ) from None
    return pyiceberg


class IcebergSinkOptions(TableSinkOptions):
    """Every option of an :class:`~sluice.sinks.iceberg.IcebergSink` (documented there), checked and
    normalised."""

    KIND: ClassVar[str] = "IcebergSink"
    COMPRESSIONS: ClassVar[tuple[str, ...]] = ("zstd", "snappy", "gzip", "lz4", "none")

    table: str
    catalog: str = "sluice"
    catalog_properties: dict[str, Any] = Field(default_factory=dict, repr=False)  # may hold credentials
    warehouse: str | None = None
    compression: str = "zstd"
    table_properties: dict[str, Any] = Field(default_factory=dict)  # passed to pyiceberg as given
    name: str = "iceberg-sink"

    @classmethod
    def check_format(cls, values: dict[str, Any]) -> None:
        import_pyiceberg()
        table = values["table"]
        parts = table.split(".") if isinstance(table, str) else []
        if len(parts) < 2 or not all(p.strip() for p in parts):
            raise ConfigError(
                f"IcebergSink: table must be 'namespace.name' (got {table!r}), e.g. 'analytics.events'"
            )
        for entry in values["partition_by"]:
            parse_partition(entry)
        values["catalog_properties"] = dict(values["catalog_properties"] or {})
        values["table_properties"] = dict(values["table_properties"] or {})

    @classmethod
    def check_partitioning(cls, values: dict[str, Any]) -> None:
        if values["table_schema"] is not None:
            partition_fields(values["partition_by"], values["table_schema"])
        _catalog_properties(values["catalog_properties"], values["warehouse"], values["storage_options"])

    def catalog_config(self) -> dict[str, str]:
        """The catalog's properties: the sink's, the embedded SqlCatalog's defaults, FileIO storage options
        (creates the local folders the embedded catalog needs)."""
        return _catalog_properties(self.catalog_properties, self.warehouse, self.storage_options)


def _catalog_properties(given: dict[str, Any], warehouse: str | None, storage_options: dict[str, Any]) -> dict[str, str]:
    props = {k: str(v) for k, v in given.items()}
    if warehouse is not None:
        props.setdefault("warehouse", warehouse)
    if "type" not in props and "uri" not in props:
        location = props.get("warehouse")
        if location is None or split_uri(location)[0] != "file":
            raise ConfigError(
                "IcebergSink: give catalog_properties a 'uri' (e.g. sqlite:////path/catalog.db for the embedded "
                "SqlCatalog, or a REST/Glue/Hive catalog's settings), or a local warehouse folder"
            )
        root = split_uri(location)[1]
        _folder(root, "warehouse")
        props["uri"] = f"sqlite:///{root}/catalog.db"
        props["warehouse"] = f"file://{root}"
    if "type" not in props and props.get("uri", "").startswith(("sqlite:", "postgresql:", "mysql:")):
        props["type"] = "sql"
    if props.get("uri", "").startswith("sqlite:///"):
        _folder(os.path.dirname(props["uri"].removeprefix("sqlite:///")) or ".", "catalog_properties['uri']")
    props.update(iceberg_io_options(storage_options))
    return props


def _folder(path: str, option: str) -> None:
    """Make the embedded catalog's folder; ConfigError naming ``option`` if it cannot be made."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"IcebergSink: {option}: the folder {path!r} cannot be made: {type(exc).__name__}: {exc.strerror or exc}"
        ) from exc
