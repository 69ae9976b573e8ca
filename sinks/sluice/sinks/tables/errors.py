"""Errors of the table sinks (Delta Lake, Apache Iceberg).

Both derive from :class:`~sluice.errors.SluiceError`::

    SluiceError
    ├── ConfigError
    │   ├── TableSchemaError   the stream's schema does not fit the table's (a restart cannot cure it)
    │   └── TableLineageError  the table holds commits of this job and sink that this run cannot explain
    └── CommitError            a table commit failed after its retries (``sluice.errors.CommitError``)
        └── RewriteLostRace    a background rewrite's commit lost a race (nothing of it landed)
"""

from __future__ import annotations

from sluice.errors import CommitError, ConfigError

__all__ = ["CommitError", "RewriteLostRace", "TableLineageError", "TableSchemaError"]


class TableSchemaError(ConfigError):
    """The stream's schema does not fit the existing table's; the message shows both schemas.

    Cast or select columns before the sink, or set ``schema_mode="merge"`` to add new columns to the table.
    """


class TableLineageError(ConfigError):
    """The table already holds a commit of this job and sink for a checkpoint id this run is about to use.

    Checkpoint ids restarted: committing would be mistaken for a re-commit and the data skipped. A wiped
    checkpoint storage or an older restore is refused before the job writes anything (a ``RestoreError``
    from the engine's lineage check); this error is the commit's own guard, e.g. against another job of the
    same name writing the table at the same time. Restore the job's latest checkpoint, or give the sink a
    new ``uid`` to start a new lineage of commits in the table.
    """


class RewriteLostRace(CommitError):
    """A background rewrite's commit lost a race: another commit replaced files it was merging (an upsert's
    copy-on-write merge rewrites the files holding changed keys at every checkpoint) or won the table's
    compare-and-swap. Nothing of the rewrite landed; :func:`~sluice.sinks.tables.rewrite.take_turn` runs it
    again holding the commit lock."""
