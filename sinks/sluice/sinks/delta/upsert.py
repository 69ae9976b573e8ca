"""Upserts into a Delta table: one checkpoint's collapsed changes applied as ONE ``DeltaTable.merge``.

The merge inserts, updates and deletes in one Delta transaction that carries
``txn(appId="sluice-<job>-<sink uid>", version=<checkpoint>)``. delta-rs records the app transaction but does
not enforce it (delta-rs #2580; a replayed merge of the same version is accepted), so :meth:`DeltaUpsert.apply`
reads ``transaction_version(appId)`` first and skips a checkpoint the table holds. A merge that loses a race
against a concurrent commit that touched the files it read (the background ``optimize``, another writer)
fails delta-rs's conflict check (``CommitFailedError``: nothing was written to the log); it is run again on
the refreshed table, after reading the app transaction version again, so a change is never lost or applied
twice. A merge that changes no row (e.g. deletes of absent keys) still records its checkpoint, in a commit
holding only the app transaction.

Everything here imports ``deltalake`` lazily (the ``sluice-etl[delta]`` extra).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import tenacity
from sluice.sink import CommitOutcome, GlobalCommitterContext
from sluice.sinks.tables.change_committer import ChangeCommitter
from sluice.sinks.tables.changes import OP, ORDER, Op, check_changes
from sluice.sinks.tables.errors import TableSchemaError
from sluice.sinks.tables.rewrite import BackgroundRewriter

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from sluice.sinks.delta.options import DeltaSinkOptions

__all__ = ["DeltaUpsert", "upsert_committer"]

log = logging.getLogger("sluice.sinks.delta")


def _no_hook(point: str) -> None:
    return None


@dataclass(frozen=True)
class DeltaUpsert:
    """Applies collapsed changes (:func:`~sluice.sinks.tables.changes.collapse`) to the Delta table at
    ``path``, one merge per checkpoint, idempotent by the app transaction ``app_id``.

    Attributes:
        path: the table (a local folder, ``file://`` or ``s3://``).
        keys: the key columns the merge joins on.
        app_id: the application id recording the checkpoints (``sluice-<job>-<sink uid>``).
        storage_options: delta-rs storage options.
        schema_mode: ``"strict"`` (the changes' columns must be the table's) or ``"merge"`` (new columns are
            added to the table, nullable).
        partition_by: partition columns, when the first merge creates the table.
        conflict_attempts: how often a merge that lost a race is run again before giving up (then the
            engine retries the commit).
        metadata: commit info added to every merge (e.g. ``sluice.job-id``).
        lock: held for each merge; the sink's background rewrite takes it for an optimize that lost a race.
    """

    path: str
    keys: tuple[str, ...]
    app_id: str
    storage_options: Mapping[str, str] = field(default_factory=dict)
    schema_mode: str = "strict"
    partition_by: tuple[str, ...] = ()
    conflict_attempts: int = 10
    metadata: Mapping[str, Any] = field(default_factory=dict)
    lock: threading.Lock | None = None

    def with_keys(self, keys: Sequence[str]) -> DeltaUpsert:
        """This engine merging on ``keys`` (sharing its lock)."""
        return dataclasses.replace(self, keys=tuple(keys))

    def open(self) -> DeltaTable | None:
        """The table, or None if there is none yet."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.path, storage_options=dict(self.storage_options))
        except TableNotFoundError:
            return None

    def committed(self) -> int:
        """The highest checkpoint the table holds for ``app_id`` (0 if none, or no table yet)."""
        table = self.open()
        return 0 if table is None else int(table.transaction_version(self.app_id) or 0)

    def apply(
        self, checkpoint_id: int, changes: pa.Table, fault_hook: Callable[[str], None] = _no_hook
    ) -> CommitOutcome:
        """Merge ``changes`` (at most one row per key) as checkpoint ``checkpoint_id``.

        Returns ``ALREADY_COMMITTED`` if the table holds the checkpoint (or a later one) for ``app_id``,
        ``COMMITTED`` once the merge landed, ``RETRY_LATER`` if it lost ``conflict_attempts`` races in a row.
        ``fault_hook("table_commit")`` runs after the version check, before the merge (a seam for tests).
        """
        from deltalake.exceptions import CommitFailedError

        check_changes(changes.schema, self.keys)
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(CommitFailedError),
            stop=tenacity.stop_after_attempt(max(1, self.conflict_attempts)),
            wait=tenacity.wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            before_sleep=lambda rs: log.info(
                "Delta merge of checkpoint %d into %s lost a race, running it again: %s",
                checkpoint_id,
                self.path,
                rs.outcome.exception() if rs.outcome is not None else None,
            ),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt, self.lock or contextlib.nullcontext():
                    return self._merge_once(checkpoint_id, changes, fault_hook)
        except CommitFailedError as exc:
            log.warning("Delta merge of checkpoint %d into %s: %s", checkpoint_id, self.path, exc)
            return CommitOutcome.RETRY_LATER
        raise AssertionError("unreachable")  # pragma: no cover

    def _merge_once(
        self, checkpoint_id: int, changes: pa.Table, fault_hook: Callable[[str], None]
    ) -> CommitOutcome:
        from deltalake.transaction import CommitProperties, Transaction

        opened = self.open()
        table = opened if opened is not None else self._create(changes.schema)
        done = table.transaction_version(self.app_id)
        if done is not None and done >= checkpoint_id:
            return CommitOutcome.ALREADY_COMMITTED
        source, evolve = self._source(table, changes)
        props = CommitProperties(
            custom_metadata={
                **self.metadata,
                "sluice.checkpoint-id": checkpoint_id,
                "sluice.operation": "upsert",
            },
            app_transactions=[Transaction(self.app_id, checkpoint_id)],
        )
        fault_hook("table_commit")
        on = key_predicate(self.keys)
        is_delete = f"s.`{OP}` = {int(Op.DELETE)}"
        not_delete = f"s.`{OP}` <> {int(Op.DELETE)}"
        controls = [OP, ORDER]
        (
            table.merge(
                source,
                on,
                source_alias="s",
                target_alias="t",
                streamed_exec=False,  # a small source: its key ranges prune the target files (early filter)
                # new columns (schema_mode="merge") join the table in the merge's own commit, with the rows
                # that carry them: never a version (nor, after a crash before the merge, a restored job's
                # table) with a column no committed change has
                merge_schema=evolve,
                commit_properties=props,
            )
            .when_matched_delete(is_delete)
            .when_matched_update_all(not_delete, except_cols=controls)
            .when_not_matched_insert_all(not_delete, except_cols=controls)
            .execute()
        )
        table.update_incremental()
        if (table.transaction_version(self.app_id) or 0) < checkpoint_id:
            # no row changed (e.g. deletes of absent keys) and delta-rs wrote no version: record it anyway
            table.create_write_transaction([], "append", table.schema(), commit_properties=props)
        return CommitOutcome.COMMITTED

    def _create(self, changes: pa.Schema) -> DeltaTable:
        from deltalake import DeltaTable

        rows = pa.schema([f for f in changes if f.name not in (OP, ORDER)])
        missing = [c for c in self.partition_by if c not in rows.names]
        if missing:
            raise TableSchemaError(
                f"DeltaSink {self.path}: partition column(s) {missing} are not in the changes"
            )
        return DeltaTable.create(
            self.path,
            rows,
            mode="ignore",
            partition_by=list(self.partition_by) or None,
            storage_options=dict(self.storage_options),
        )

    def _source(self, table: DeltaTable, changes: pa.Table) -> tuple[pa.Table, bool]:
        """The merge source: the changes cast to the table's column types, columns the table has and the
        changes lack as nulls, then the columns the changes add (``schema_mode="merge"``, nullable; the merge
        adds them to the table: True when there are such)."""
        from sluice.sinks.delta.table import describe_schema

        have = pa.schema(table.schema().to_arrow())
        rows = pa.schema([f for f in changes.schema if f.name not in (OP, ORDER)])
        have_types, want_types = describe_schema(have), describe_schema(rows)
        changed = {
            c: (have_types[c], t) for c, t in want_types.items() if c in have_types and have_types[c] != t
        }
        new = [rows.field(c).with_nullable(True) for c in want_types if c not in have_types]
        if changed or (new and self.schema_mode != "merge"):
            raise TableSchemaError(
                f"DeltaSink {self.path}: the changes' columns do not fit the table's: "
                + "; ".join(
                    ([f"types differ: {changed}"] if changed else [])
                    + ([f"new columns {[f.name for f in new]} (set schema_mode='merge' to add them)"] if new else [])
                )
            )
        fields = [*have, *new]
        cols: list[pa.Array | pa.ChunkedArray] = []
        for f in fields:
            if f.name in changes.column_names:
                col = changes.column(f.name)
                cols.append(col.cast(f.type) if col.type != f.type else col)
            else:
                cols.append(pa.nulls(changes.num_rows, f.type))
        schema = pa.schema([f.with_nullable(True) for f in fields] + [(OP, changes.column(OP).type),
                                                                       (ORDER, changes.column(ORDER).type)])
        return pa.table([*cols, changes.column(OP), changes.column(ORDER)], schema=schema), bool(new)


def key_predicate(keys: Sequence[str]) -> str:
    """The merge's join predicate on ``keys`` (target ``t``, source ``s``)."""
    return " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)


def upsert_committer(options: DeltaSinkOptions, ctx: GlobalCommitterContext) -> ChangeCommitter:
    """The global committer of a DeltaSink in upsert mode: one merge per checkpoint (with the background
    ``optimize`` of ``options.rewrite``, whose conflicts the merge survives by running again; an optimize
    that lost to a merge runs again holding the merge's lock)."""
    from sluice.sinks.delta.committer import app_id
    from sluice.sinks.delta.rewrite import rewrite_small_files

    engine = DeltaUpsert(
        options.path,
        tuple(options.key_columns),
        app_id(ctx.job_id, ctx.sink_uid),
        options.delta_storage_options(),
        schema_mode=options.schema_mode,
        partition_by=tuple(options.partition_by),
        conflict_attempts=max(1, options.commit_retries),
        metadata={"sluice.job-id": ctx.job_id, "sluice.sink-uid": ctx.sink_uid},
        lock=threading.Lock(),
    )
    rewriter: BackgroundRewriter | None = None
    if options.rewrite is not None:
        policy = options.rewrite
        rewriter = BackgroundRewriter(
            f"DeltaSink {options.path}", policy, lambda: rewrite_small_files(options, policy, engine.lock), ctx.metric
        )
    return ChangeCommitter(
        f"DeltaSink {options.path}",
        engine,
        options.filesystem,
        options.key_columns,
        ctx,
        on_commit=rewriter.committed if rewriter is not None else None,
        on_close=rewriter.close if rewriter is not None else None,
    )
