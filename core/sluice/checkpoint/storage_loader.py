"""Which checkpoint storage a job's configuration or a URI names (Flink's ``CheckpointStorageLoader``):
a local path or ``file://`` (:class:`~sluice.checkpoint.storage.LocalCheckpointStorage`), ``s3://``
(:class:`~sluice.checkpoint.s3.S3CheckpointStorage`, imported only when used, so boto3 loads only for S3),
or a scheme registered under the ``sluice.checkpoint_storage`` entry point group."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from sluice.checkpoint.storage import CheckpointStorage, LocalCheckpointStorage
from sluice.config import CheckpointConfig
from sluice.errors import ConfigError

__all__ = ["checkpoint_storage", "storage_for"]


def storage_for(config: CheckpointConfig, job_id: str) -> CheckpointStorage:
    """The checkpoint storage a job's ``config`` names, with its options and retry time."""
    storage = checkpoint_storage(config.storage, job_id, **config.storage_options)
    storage.retry_timeout = config.storage_retry_timeout
    return storage


def checkpoint_storage(uri: str, job_id: str, **options: Any) -> CheckpointStorage:
    """The storage for ``uri``: a local path, ``file://...``, or a scheme registered under the
    ``sluice.checkpoint_storage`` entry point group (``s3://``)."""
    if "://" not in uri or uri.startswith("file://"):
        return LocalCheckpointStorage(uri, job_id)
    scheme = uri.split("://", 1)[0]
    if scheme == "s3":
        from sluice.checkpoint.s3 import S3CheckpointStorage

        return S3CheckpointStorage(uri, job_id, **options)
    for ep in entry_points(group="sluice.checkpoint_storage"):
        if ep.name == scheme:
            cls = ep.load()
            return cls(uri, job_id, **options)  # type: ignore[no-any-return]
    raise ConfigError(
        f"checkpoint storage: no storage for scheme {scheme!r} (allowed: local path, file://, s3://)"
    )
