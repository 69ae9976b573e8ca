"""The merge-on-read global committer: per checkpoint one row-delta snapshot of the data files the writers
wrote (the new row versions) and the position-delete files of the old versions, idempotent by
``sluice.max-committed-checkpoint-id`` as every sluice commit.

Writers stage the old positions of the keys they changed (file id, position: their index's entries) under
``_sluice_changes/``; the committer maps each file id to a live data file of the table (or, for a file a
rewrite replaced since, through the rewrite maps, :mod:`~sluice.sinks.iceberg.mor.maps`), checks every
position is inside its file, writes one position-delete file per partition (named
``delete-<job>-<ckpt>-a<attempt>-<seq>-<run>.parquet``) and commits them with the data files. A position that
resolves to no live row is an index that does not describe the table: the commit is refused and nothing lands.

Lineage: the index describes the table as this job's and sink's commits left it. At every commit (and when
an attempt starts) the snapshots since the newest of this job and sink must all be its own (checkpoint
commits and rewrites); a job that starts on a table with rows needs ``rebuild_index=True`` (the writers read
the index from the table; this attempt's start is then the base). Anything else is an
:class:`~sluice.sinks.iceberg.mor.live.IndexLineageError`, in one line, before anything is written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import tenacity
from sluice.errors import CommitError, ConfigError
from sluice.sink import CommitOutcome, GlobalCommitter, GlobalCommitterContext
from sluice.sinks.iceberg.catalog import open_or_create
from sluice.sinks.iceberg.layout import JOB_ID, MAX_COMMITTED, SINK_UID, data_file, max_committed_checkpoint
from sluice.sinks.iceberg.mor.deletes import delete_file_name, parse_delete_file_name, write_deletes
from sluice.sinks.iceberg.mor.live import IndexLineageError, LiveFiles, foreign_snapshots, has_rows
from sluice.sinks.iceberg.mor.maps import RewriteMaps
from sluice.sinks.iceberg.mor.positions import file_id
from sluice.sinks.iceberg.mor.snapshot import check_pyiceberg, commit_files
from sluice.sinks.iceberg.options import IcebergSinkOptions
from sluice.sinks.tables.changes import CHANGES_DIR, delete_staged, remove_orphaned_changes
from sluice.sinks.tables.errors import TableLineageError
from sluice.sinks.tables.files import TableFile, run_token
from sluice.sinks.tables.rewrite import BackgroundRewriter
from sluice.sinks.tables.storage import arrow_filesystem

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

__all__ = ["MergeOnReadCommitter", "is_staged_deletes"]

log = logging.getLogger("sluice.sinks.iceberg")

#: the summary property naming what a sluice commit did
OPERATION = "sluice.operation"


def is_staged_deletes(c: TableFile) -> bool:
    """Whether a committable is a writer's staged old positions (else it is a data file)."""
    return c.path.startswith(f"{CHANGES_DIR}/")


class MergeOnReadCommitter(GlobalCommitter[TableFile]):
    """Commits each checkpoint as one row-delta snapshot (on the coordinator); see the module docstring."""

    def __init__(self, options: IcebergSinkOptions, ctx: GlobalCommitterContext, conflict_attempts: int = 10) -> None:
        check_pyiceberg()
        self.options, self.ctx = options, ctx
        self.name = f"IcebergSink {options.table}"
        self.conflict_attempts = conflict_attempts
        #: held by checkpoint commits and the rewrite's commit step
        self.lock = threading.Lock()
        self._tried: set[int] = set()
        self._run = run_token()
        self._seq = 0
        self._live: LiveFiles | None = None
        self._maps: RewriteMaps | None = None
        self.base: int | None = None
        self._started = False
        self.rewriter: BackgroundRewriter | None = None
        table = open_or_create(options, None)
        if table is not None:
            self._start(table)
            self._sweep(table)
        if options.rewrite is not None:
            from sluice.sinks.iceberg.mor.rewrite import fold_deletes

            policy = options.rewrite
            self.rewriter = BackgroundRewriter(self.name, policy, lambda: fold_deletes(self, policy), ctx.metric)

    # -- the table as the committer sees it ----------------------------------------------------------------
    def _start(self, table: Table) -> None:
        """Once per attempt (or at the first commit, if the writers made the table): the index's base."""
        self._started = True
        if table.metadata.format_version != 2:
            raise ConfigError(
                f"{self.name}: write_mode='merge-on-read' writes position-delete files, which need an Iceberg "
                f"format-version 2 table; this table is version {table.metadata.format_version} (use "
                "write_mode='copy-on-write', or a v2 table)"
            )
        current = table.current_snapshot()
        foreign, reached = foreign_snapshots(table, self.ctx.job_id, self.ctx.sink_uid, None)
        if self.options.rebuild_index or (not reached and not has_rows(table)):
            self.base = current.snapshot_id if current is not None else None
        elif foreign:
            raise self._changed(foreign, table)
        if not reached and has_rows(table) and not self.options.rebuild_index:
            raise IndexLineageError(
                f"{self.name}: write_mode='merge-on-read' starts with an empty index, and the table holds rows "
                f"this job and sink did not write (snapshot {current.snapshot_id if current else None}): set "
                "rebuild_index=True to build the index from the table"
            )

    def _sweep(self, table: Table) -> None:
        """Once per attempt, before its first commit: staged positions, position-delete files and rewrite maps
        of commits that never landed deleted."""
        fs, root = self.storage(table)
        committed = max_committed_checkpoint(table, self.ctx.job_id, self.ctx.sink_uid)
        remove_orphaned_changes(fs, root, self.ctx.job_id, committed, self.ctx.restored_checkpoint_id)
        self._remove_orphans(table, committed)

    def _changed(self, foreign: list[Any], table: Table) -> IndexLineageError:
        newest = foreign[0]
        props = dict(newest.summary.additional_properties) if newest.summary is not None else {}
        who = f"job {props[JOB_ID]!r}" if JOB_ID in props else "another writer"
        op = newest.summary.operation.value if newest.summary is not None else "?"
        return IndexLineageError(
            f"{self.name}: the table changed behind the merge-on-read index: {len(foreign)} snapshot(s) since "
            f"this job's last commit are not its own (newest: {newest.snapshot_id}, {op} by {who}); restart with "
            "rebuild_index=True to build the index from the table as it is"
        )

    def storage(self, table: Table) -> tuple[pafs.FileSystem, str]:
        return arrow_filesystem(table.location().rstrip("/"), self.options.storage_options)

    def load(self) -> Table:
        table = open_or_create(self.options, None)
        if table is None:
            raise CommitError(f"{self.name}: the table is gone")
        return table

    def live(self, table: Table) -> LiveFiles:
        """The table's live data files (kept while the table's current snapshot is the one they describe)."""
        current = table.current_snapshot()
        sid = current.snapshot_id if current is not None else None
        if self._live is None or self._live.snapshot_id != sid:
            self._live = LiveFiles.of(table)
        return self._live

    def maps(self, table: Table) -> RewriteMaps:
        if self._maps is None:
            self._maps = RewriteMaps(*self.storage(table))
        return self._maps

    def forget_live(self) -> None:
        """The table moved (a rewrite committed): read the live files again at the next commit."""
        self._live = None

    def _remove_orphans(self, table: Table, committed: int) -> None:
        """Delete position-delete files of this job's checkpoints after ``committed`` (their commit never
        landed) and rewrite maps whose rewrite never landed."""
        fs, root = self.storage(table)
        doomed = []
        for info in fs.get_file_info(pafs.FileSelector(f"{root}/data", recursive=True, allow_not_found=True)):
            parsed = parse_delete_file_name(info.base_name)
            if info.type == pafs.FileType.File and parsed and parsed[0] == self.ctx.job_id and parsed[1] > committed:
                doomed.append(info.path)
        for path in doomed:
            fs.delete_file(path)
        live = self.live(table)
        maps = self.maps(table)
        for rel in maps.uncommitted(live.__contains__):
            maps.remove(rel)
        if doomed:
            log.info("%s: deleted %d position-delete file(s) whose commit never landed", self.name, len(doomed))

    # -- commits ----------------------------------------------------------------------------------------------
    def commit(self, checkpoint_id: int, committables: Sequence[TableFile]) -> CommitOutcome:
        from pyiceberg.exceptions import CommitFailedException, ValidationException

        if not committables:
            return CommitOutcome.COMMITTED
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((CommitFailedException, ValidationException)),
            stop=tenacity.stop_after_attempt(max(1, self.conflict_attempts)),
            wait=tenacity.wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt, self.lock:
                    outcome = self._commit_once(checkpoint_id, committables)
        except (CommitFailedException, ValidationException) as exc:
            log.warning("%s: commit of checkpoint %d lost every race: %s", self.name, checkpoint_id, exc)
            return CommitOutcome.RETRY_LATER
        except (CommitError, ConfigError):
            raise
        except Exception as exc:
            if not getattr(exc, "recoverable", True):
                raise
            raise CommitError(f"{self.name}: commit of checkpoint {checkpoint_id} failed: {exc}") from exc
        table = self.load()
        fs, root = self.storage(table)
        if outcome is CommitOutcome.COMMITTED:
            self.ctx.fault_hook("commit")  # the snapshot landed; the engine does not know yet
        delete_staged(fs, root, [c for c in committables if is_staged_deletes(c)])
        if self.ctx.attempt > 0:  # a failed attempt's subtask may still have been staging at our first sweep
            remove_orphaned_changes(
                fs, root, self.ctx.job_id, checkpoint_id, self.ctx.restored_checkpoint_id, before_attempt=self.ctx.attempt
            )
        if outcome is CommitOutcome.COMMITTED and self.rewriter is not None:
            self.rewriter.committed()
        return outcome

    def _commit_once(self, checkpoint_id: int, committables: Sequence[TableFile]) -> CommitOutcome:
        from pyiceberg.exceptions import CommitFailedException, ValidationException
        from pyiceberg.table.snapshots import Operation

        table = self.load()
        if not self._started:
            self._start(table)  # the writers made the table after this committer: nothing to sweep
        done = max_committed_checkpoint(table, self.ctx.job_id, self.ctx.sink_uid)
        if done >= checkpoint_id:
            if checkpoint_id not in self._tried and checkpoint_id > (self.ctx.restored_checkpoint_id or 0):
                raise TableLineageError(
                    f"{self.name}: the table already holds checkpoint {done} of job {self.ctx.job_id!r}, sink "
                    f"{self.ctx.sink_uid!r}, and this run is about to commit its checkpoint {checkpoint_id}: "
                    "checkpoint ids restarted (checkpoint storage wiped?). Restore the job's latest checkpoint, "
                    "or give the sink a new uid"
                )
            return CommitOutcome.ALREADY_COMMITTED
        foreign, _ = foreign_snapshots(table, self.ctx.job_id, self.ctx.sink_uid, self.base)
        if foreign:
            raise self._changed(foreign, table)
        self._tried.add(checkpoint_id)
        started = time.perf_counter()
        live = self.live(table)
        added = [self._data_file(table, c) for c in committables if not is_staged_deletes(c)]
        staged = [c for c in committables if is_staged_deletes(c)]
        fs, _ = self.storage(table)
        written: list[str] = []
        try:
            deletes = self._deletes(table, live, added, staged, checkpoint_id, written)
            self.ctx.fault_hook("table_commit")
            props = {
                JOB_ID: self.ctx.job_id,
                SINK_UID: self.ctx.sink_uid,
                MAX_COMMITTED: str(checkpoint_id),
                OPERATION: "upsert merge-on-read",
            }
            op = Operation.OVERWRITE if deletes and added else Operation.DELETE if deletes else Operation.APPEND
            snapshot_id = commit_files(table, op, props, added + deletes)
        except (CommitFailedException, ValidationException):
            for path in written:  # the commit certainly did not land
                fs.delete_file(path)
            self._live = None
            raise
        live.snapshot_id = snapshot_id
        for f in added:
            live.add(f)
        log.info(
            "%s: checkpoint %d: %d data file(s), %d delete file(s) (%d positions) in %.2f s",
            self.name, checkpoint_id, len(added), len(deletes), sum(d.record_count for d in deletes),
            time.perf_counter() - started,
        )  # fmt: skip
        return CommitOutcome.COMMITTED

    def _data_file(self, table: Table, c: TableFile) -> DataFile:
        df = data_file(table, c)
        df.spec_id = dict(c.stats)["spec_id"]
        return df

    def _deletes(
        self, table: Table, live: LiveFiles, added: list[DataFile], staged: list[TableFile], checkpoint_id: int,
        written: list[str],
    ) -> list[DataFile]:
        """The position-delete files of the staged old positions, one per partition (written to storage)."""
        fs, root = self.storage(table)
        parts = [pq.read_table(f"{root}/{c.path}", filesystem=fs) for c in staged]
        parts = [p for p in parts if p.num_rows]
        if not parts:
            return []
        old = pa.concat_tables(parts)
        files = np.asarray(old.column("file").to_numpy(), np.int64)
        positions = np.asarray(old.column("pos").to_numpy(), np.int64)
        known = dict(live.files)
        for f in added:
            known[file_id(f.file_path)] = f
        is_live = known.__contains__
        files, positions, lost = self.maps(table).translate(files, positions, is_live)
        if lost and self.options.rebuild_index:  # a restored checkpoint staged before the table changed
            raise IndexLineageError(
                f"{self.name}: checkpoint {checkpoint_id}: its deletes were staged against data files the table "
                f"no longer holds ({len(lost)}; it changed behind the job while this checkpoint's commit was "
                "pending), and staged deletes are row positions, not keys, so rebuild_index=True cannot place "
                "them on the rewritten rows: restore an earlier checkpoint with allow_reprocessing=True, or start "
                "without restore with rebuild_index=True and a source that reads again from at or before this "
                "checkpoint's offsets (e.g. KafkaSource(starting_offsets='earliest') within the topic's "
                "retention; a source that starts later skips this checkpoint's changes)"
            )
        if lost:
            raise IndexLineageError(
                f"{self.name}: checkpoint {checkpoint_id}: the merge-on-read index names rows in {len(lost)} data "
                "file(s) that are not in the table and that no committed rewrite moved: the index does not "
                "describe the table; restart with rebuild_index=True"
            )
        out: list[DataFile] = []
        location = table.location().rstrip("/")
        schema = table.schema()
        groups: dict[tuple[int, Any], list[int]] = {}
        for fid in np.unique(files).tolist():
            f = known[fid]
            groups.setdefault((f.spec_id, f.partition), []).append(fid)
        for (spec_id, partition), fids in groups.items():
            mask = np.isin(files, fids)
            sel_files, sel_pos = files[mask], positions[mask]
            uniq = np.unique(sel_files)
            codes = np.searchsorted(uniq, sel_files)  # per position, its data file among ``uniq``
            counts = np.array([known[int(x)].record_count for x in uniq.tolist()], np.int64)[codes]
            if (sel_pos < 0).any() or (sel_pos >= counts).any():
                raise IndexLineageError(
                    f"{self.name}: checkpoint {checkpoint_id}: the merge-on-read index holds a position past the "
                    "end of its data file: the index does not describe the table; restart with rebuild_index=True"
                )
            paths = pa.array([known[int(x)].file_path for x in uniq.tolist()], pa.string())
            spec = table.specs()[spec_id]
            ppath = spec.partition_to_path(partition, schema) if spec.fields else ""
            self._seq += 1
            name = delete_file_name(self.ctx.job_id, checkpoint_id, self.ctx.attempt, self._seq, self._run)
            rel = f"data/{ppath}/{name}" if ppath else f"data/{name}"
            written.append(f"{root}/{rel}")
            out.append(
                write_deletes(fs, root, location, rel, paths.take(pa.array(codes)), sel_pos, spec_id, partition,
                              self.options.compression)
            )  # fmt: skip
        return out

    def close(self) -> None:
        if self.rewriter is not None:
            self.rewriter.close()
