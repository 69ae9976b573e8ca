"""Errors of the file sink.

Both derive from :class:`~sluice.errors.SluiceError`::

    SluiceError
    ├── SchemaMismatchError   a batch does not fit the schema of its bucket's open file
    └── StorageError          the file system or S3 refused an operation (``sluice.errors.StorageError``)
"""

from __future__ import annotations

from sluice.errors import SluiceError, StorageError

__all__ = ["SchemaMismatchError", "StorageError"]


class SchemaMismatchError(SluiceError, ValueError):
    """A batch's schema differs from the schema of the file open in its bucket.

    Set ``schema_evolution=True`` on the FileSink to roll to a new file instead.
    """
