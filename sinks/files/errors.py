"""Errors of the file sink.

Both derive from :class:`~sluice.errors.SluiceError`::

    SluiceError
    ├── SchemaMismatchError   a batch does not fit the schema of its bucket's open file
    └── StorageError          the file system or S3 refused an operation (names bucket and operation)
"""

from __future__ import annotations

from sluice.errors import SluiceError

__all__ = ["SchemaMismatchError", "StorageError"]


class SchemaMismatchError(SluiceError, ValueError):
    """A batch's schema differs from the schema of the file open in its bucket.

    Set ``schema_evolution=True`` on the FileSink to roll to a new file instead.
    """


class StorageError(SluiceError):
    """A storage operation failed for good.

    Attributes:
        operation: what was attempted (e.g. ``"PutObject"``).
        bucket: the S3 bucket (or local root) it was attempted on.
        code: the service's error code (e.g. ``"AccessDenied"``, ``"NoSuchBucket"``), or ``""``.
    """

    def __init__(self, message: str, *, operation: str, bucket: str, code: str = "") -> None:
        self.operation = operation
        self.bucket = bucket
        self.code = code
        super().__init__(message)
