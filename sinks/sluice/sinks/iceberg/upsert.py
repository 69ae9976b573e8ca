"""Upserts into an Iceberg table: one checkpoint's collapsed changes as one copy-on-write overwrite snapshot.

:class:`IcebergUpsert` reads the table's recorded checkpoint first (the newest snapshot of the job and sink
holds ``sluice.max-committed-checkpoint-id``, as for the append commits) and skips a checkpoint the table
holds. Otherwise it rewrites only the data files that hold changed keys (:mod:`sluice.sinks.iceberg.merge`)
and commits **one** snapshot that deletes them and adds their replacements and the new rows, its summary
carrying the job id, the sink uid and the checkpoint id: a reader sees the table before the checkpoint or
after it, never in between. A merge that changes nothing still records its checkpoint (an empty append).

Concurrent rewrites: the background rewrite of the same sink shares ``lock`` (held for the whole merge, so
it never swaps files the merge is about to replace); another writer's commit in between fails the catalog's
compare-and-swap, or pyiceberg's validation that the files the merge deletes are still live (a compaction
replaced them): the merge deletes what it wrote and runs again on the refreshed table, after reading the
recorded checkpoint again. A change is never lost or applied twice.

Merged files are named ``merge-<job>-<checkpoint>-a<attempt>-<seq>-<run>.parquet``. One that a crash left
behind before its commit belongs to a checkpoint after the table's recorded one: :meth:`remove_orphans`,
called before an attempt's first merge, deletes it.

pyiceberg gives the same table two ways, kept as the benchmark's peers (benchmarks/upserts.py) and a test's
cross-check; the sink uses neither. :func:`pyiceberg_overwrite` is its one-call copy-on-write, the path its
docs recommend: ``overwrite`` of the changed rows with an ``In`` filter over every changed key, in one
transaction, so each touched file is rewritten once. :func:`pyiceberg_upsert` is ``delete`` (of the keys
whose last change is a delete) + ``upsert`` (of the rest): for a one-column key both build one ``In``
filter (not an expression per key), but every touched file is rewritten twice (by the delete, then by the
upsert's overwrite) after a scan of the matched rows, whose non-key cells ``upsert`` compares one row at a
time in Python (``pyiceberg.table.upsert_util.get_rows_to_update``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import tenacity
from sluice.sink import CommitOutcome
from sluice.sinks.iceberg.layout import JOB_ID, MAX_COMMITTED, SINK_UID, max_committed_checkpoint
from sluice.sinks.iceberg.merge import MergeFiles, conform, merge_files
from sluice.sinks.tables.changes import check_changes, row_columns, upserts_and_deletes
from sluice.sinks.tables.errors import TableSchemaError
from sluice.sinks.tables.files import run_token
from sluice.sinks.tables.storage import arrow_filesystem

if TYPE_CHECKING:
    from pyiceberg.table import Table

__all__ = ["OPERATION", "IcebergUpsert", "merge_file_name", "pyiceberg_overwrite", "pyiceberg_upsert"]

log = logging.getLogger("sluice.sinks.iceberg")

#: snapshot summary property naming what a sluice commit did (``upsert``)
OPERATION = "sluice.operation"
_MERGED = re.compile(r"^merge-(?P<job>.+)-(?P<ckpt>\d{8})-a\d+-\d{4,}-[0-9a-f]{12}\.parquet$")


def _no_hook(point: str) -> None:
    return None


def merge_file_name(job_id: str, checkpoint_id: int, attempt: int, seq: int, run: str) -> str:
    """The name of a data file a merge writes (see the module docstring)."""
    return f"merge-{job_id}-{checkpoint_id:08d}-a{attempt}-{seq:04d}-{run}.parquet"


@dataclass
class IcebergUpsert:
    """Applies collapsed changes (:func:`~sluice.sinks.tables.changes.collapse`) to an Iceberg table, one
    overwrite snapshot per checkpoint, idempotent by the snapshot summary.

    Attributes:
        load: returns the table freshly loaded from the catalog; given a schema (the changes' row columns)
            it creates the table if it is missing, given None it returns None then.
        keys: the key columns.
        job_id: the job whose commits the summary records.
        sink_uid: the sink's uid, recorded with the job id.
        storage_options: FileIO / pyarrow storage options of the table's location.
        schema_mode: ``"strict"`` or ``"merge"`` (new nullable columns of the changes join the table).
        compression: Parquet compression of the files the merge writes.
        target_file_size: bytes; the merge cuts its files at about this size.
        attempt: the job attempt (in file names).
        conflict_attempts: how often a merge that lost a race runs again before ``RETRY_LATER``.
        lock: held for each merge; the sink's background rewrite takes it for its swaps.
    """

    load: Callable[[pa.Schema | None], Table | None]
    keys: tuple[str, ...]
    job_id: str
    sink_uid: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    schema_mode: str = "strict"
    compression: str = "zstd"
    target_file_size: int = 128 * 1024 * 1024
    attempt: int = 0
    conflict_attempts: int = 10
    lock: threading.Lock | None = None
    #: what the last merge read, replaced and wrote (for metrics and benchmarks)
    last: MergeFiles | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._run = run_token()
        self._seq = itertools.count()

    def with_keys(self, keys: Sequence[str]) -> IcebergUpsert:
        """This engine merging on ``keys`` (sharing its lock)."""
        return dataclasses.replace(self, keys=tuple(keys))

    def committed(self) -> int:
        """The highest checkpoint of the job and sink the table holds (0 if none, or no table yet)."""
        return self._committed_in(self.load(None))

    def _committed_in(self, table: Table | None) -> int:
        return max_committed_checkpoint(table, self.job_id, self.sink_uid) if table is not None else 0

    def apply(
        self, checkpoint_id: int, changes: pa.Table, fault_hook: Callable[[str], None] = _no_hook
    ) -> CommitOutcome:
        """Merge ``changes`` (at most one row per key) as checkpoint ``checkpoint_id``.

        Returns ``ALREADY_COMMITTED`` if the table holds the checkpoint (or a later one) of the job and sink,
        ``COMMITTED`` once the snapshot landed, ``RETRY_LATER`` after ``conflict_attempts`` lost races.
        ``fault_hook("table_commit")`` runs after the files are written, before the commit.
        """
        from pyiceberg.exceptions import CommitFailedException, ValidationException

        check_changes(changes.schema, self.keys)
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((CommitFailedException, ValidationException)),
            stop=tenacity.stop_after_attempt(max(1, self.conflict_attempts)),
            wait=tenacity.wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            before_sleep=lambda rs: log.info(
                "Iceberg merge of checkpoint %d lost a race, running it again: %s",
                checkpoint_id,
                rs.outcome.exception() if rs.outcome is not None else None,
            ),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt, self.lock or contextlib.nullcontext():
                    return self._merge_once(checkpoint_id, changes, fault_hook)
        except (CommitFailedException, ValidationException) as exc:
            log.warning("Iceberg merge of checkpoint %d: %s", checkpoint_id, exc)
            return CommitOutcome.RETRY_LATER
        raise AssertionError("unreachable")  # pragma: no cover

    def _merge_once(
        self, checkpoint_id: int, changes: pa.Table, fault_hook: Callable[[str], None]
    ) -> CommitOutcome:
        from pyiceberg.exceptions import CommitFailedException, ValidationException

        rows = pa.schema([changes.schema.field(c) for c in row_columns(changes.schema)])
        table = self._table(rows)
        if self._committed_in(table) >= checkpoint_id:
            return CommitOutcome.ALREADY_COMMITTED
        new = self._new_columns(table, rows)
        fs, root = arrow_filesystem(table.location(), dict(self.storage_options))
        props = {
            JOB_ID: self.job_id,
            SINK_UID: self.sink_uid,
            MAX_COMMITTED: str(checkpoint_id),
            OPERATION: "upsert",
        }
        files = MergeFiles()
        try:
            # one transaction: new columns (schema_mode="merge") join the table in the snapshot that brings
            # the rows carrying them, never before it (nor, after a crash before the commit, in a restored
            # job's table). The merge's files are written against the schema the transaction stages.
            with table.transaction() as tx:
                if new:
                    with tx.update_schema() as evolve:
                        evolve.union_by_name(pa.schema(new))
                files = merge_files(
                    _staged(table, tx) if new else table,
                    changes,
                    self.keys,
                    fs,
                    root,
                    lambda: merge_file_name(self.job_id, checkpoint_id, self.attempt, next(self._seq), self._run),
                    checkpoint_id,
                    self.compression,
                    self.target_file_size,
                )
                self.last = files
                fault_hook("table_commit")
                update = tx.update_snapshot(snapshot_properties=props)
                if files.replaced:
                    with update.overwrite() as overwrite:
                        for f in files.replaced:
                            overwrite.delete_data_file(f)
                        for f in files.added:
                            overwrite.append_data_file(f)
                else:
                    with update.fast_append() as append:
                        for f in files.added:
                            append.append_data_file(f)
        except (CommitFailedException, ValidationException):
            _delete(fs, files.written)  # the commit certainly did not land
            raise
        return CommitOutcome.COMMITTED

    def _new_columns(self, table: Table, rows: pa.Schema) -> list[pa.Field]:
        """TableSchemaError unless ``rows`` fits the table; the columns ``rows`` adds to it (nullable; allowed
        with ``schema_mode="merge"``)."""
        from pyiceberg.catalog import Catalog

        have = {f.name: str(f.field_type) for f in table.schema().fields}
        want = {f.name: str(f.field_type) for f in Catalog._convert_schema_if_needed(rows).fields}
        changed = {c: (have[c], t) for c, t in want.items() if c in have and have[c] != t}
        new = [rows.field(c).with_nullable(True) for c in want if c not in have]
        if changed or (new and self.schema_mode != "merge"):
            raise TableSchemaError(
                f"Iceberg table {table.name()}: the changes' columns do not fit the table's: "
                + "; ".join(
                    ([f"types differ: {changed}"] if changed else [])
                    + ([f"new columns {[f.name for f in new]} (set schema_mode='merge' to add them)"] if new else [])
                )
            )
        return new

    def _table(self, rows: pa.Schema) -> Table:
        table = self.load(rows)
        if table is None:
            raise RuntimeError("IcebergUpsert.load returned no table for a schema")
        return table

    def remove_orphans(self) -> int:
        """Delete files merges of this job wrote for checkpoints after the table's recorded one (their commit
        never landed); returns how many. Call before an attempt's first merge."""
        table = self.load(None)
        if table is None:
            return 0
        committed = self._committed_in(table)
        fs, root = arrow_filesystem(table.location(), dict(self.storage_options))
        doomed = []
        selector = pafs.FileSelector(f"{root}/data", recursive=True, allow_not_found=True)
        for info in fs.get_file_info(selector):
            m = _MERGED.match(info.base_name)
            if (
                info.type == pafs.FileType.File
                and m
                and m["job"] == self.job_id
                and int(m["ckpt"]) > committed
            ):
                doomed.append(info.path)
        _delete(fs, doomed)
        if doomed:
            log.info(
                "deleted %d merged file(s) of job %s whose commit never landed", len(doomed), self.job_id
            )
        return len(doomed)


def _delete(fs: pafs.FileSystem, paths: Sequence[str]) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(p)


def pyiceberg_overwrite(
    table: Table, changes: pa.Table, keys: Sequence[str], snapshot_properties: Mapping[str, str]
) -> None:
    """pyiceberg's copy-on-write of collapsed ``changes`` in one call: ``overwrite`` of the rows whose last
    change is not a delete, its filter matching every changed key (``In`` for a one-column key), in one
    transaction (one catalog commit). The benchmark's peer at its best (module docstring)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.table.upsert_util import create_match_filter

    upserts, _ = upserts_and_deletes(changes)
    key_filter = create_match_filter(changes.select(list(keys)), list(keys))  # one In(key, values) for one key
    props = dict(snapshot_properties)
    with table.transaction() as tx:
        if upserts.num_rows:
            rows = conform(upserts, schema_to_pyarrow(table.schema(), include_field_ids=False))
            tx.overwrite(rows, overwrite_filter=key_filter, snapshot_properties=props)
        else:
            tx.delete(key_filter, snapshot_properties=props)


def pyiceberg_upsert(
    table: Table, changes: pa.Table, keys: Sequence[str], snapshot_properties: Mapping[str, str]
) -> None:
    """pyiceberg's ``delete`` (of the keys whose last change is a delete) + ``upsert`` (of the rest) in one
    transaction: one catalog commit. A slower path of the benchmark's peer, reported beside
    :func:`pyiceberg_overwrite` (module docstring)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.table.upsert_util import create_match_filter

    upserts, deletes = upserts_and_deletes(changes)
    props = dict(snapshot_properties)
    with table.transaction() as tx:
        if deletes.num_rows:
            tx.delete(create_match_filter(deletes.select(list(keys)), list(keys)), snapshot_properties=props)
        if upserts.num_rows:
            rows = conform(upserts, schema_to_pyarrow(table.schema(), include_field_ids=False))
            tx.upsert(rows, join_cols=list(keys), snapshot_properties=props)


def _staged(table: Table, tx: Any) -> Table:
    """``table`` as transaction ``tx`` leaves it (its staged schema; the same snapshot, files and location)."""
    from pyiceberg.table import Table as _Table

    return _Table(table.name(), tx.table_metadata, table.metadata_location, table.io, table.catalog)
