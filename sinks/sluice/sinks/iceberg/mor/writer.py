"""The merge-on-read writer: per checkpoint the new row versions as data files of the table, the old
versions' positions from the primary-key index in the job's keyed state.

The sink reads its input through a hash exchange on the key columns, so a key's changes all reach one
writer subtask, and its index entry (key -> data file id, row position; :mod:`~sluice.sinks.iceberg.mor.positions`)
lives in that subtask's keyed state, checkpointed with it and moved by key group when the job rescales.

At pre-commit (checkpoint n), the writer collapses what it buffered to the last change per key, then:

1. reads the index entries of the changed keys (one batch-wise multi-get): the positions of their versions
   the table holds;
2. writes the upserted rows as data files (per partition, sorted by key, under ``data/``, invisible until
   a snapshot names them) and knows each row's position;
3. updates the index: upserted keys point at their new rows, deleted keys lose their entry;
4. stages the old positions (file id, position) under ``_sluice_changes/`` for the committer, which turns
   them into position-delete files.

Steps 1-3 run before the barrier's keyed snapshot, so checkpoint n's state holds the index as the table is
once n's snapshot commits; the data files and staged positions are n's committables. Restored to n, the
index equals the table after n's commit (which the restore commits again, idempotently, before any writer
starts); files of checkpoints after n are deleted by ``IcebergSink.recover`` and the committer.

``rebuild_index=True``: at its first pre-commit of an attempt, a writer drops its index and reads it from the
table (the key columns of every live data file, minus deleted positions, for the key groups it owns).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sluice.changes import OP, Op
from sluice.sink import SinkContext
from sluice.sinks.iceberg.format import IcebergFormat
from sluice.sinks.iceberg.layout import IcebergLayout
from sluice.sinks.iceberg.mor.deletes import read_deletes
from sluice.sinks.iceberg.mor.positions import INDEX, file_id, index_descriptor, pack, unpack
from sluice.sinks.iceberg.options import IcebergSinkOptions
from sluice.sinks.iceberg.upsert_sink import staging_storage
from sluice.sinks.tables.change_writer import ChangeWriter
from sluice.sinks.tables.changes import CHANGES_DIR, ChangeError, row_columns
from sluice.sinks.tables.files import TableFile, data_file_name, schema_fingerprint, write_parquet
from sluice.sinks.tables.storage import arrow_filesystem
from sluice.sinks.tables.writer import write_file
from sluice.state.spi import KeyBatch, take_keys

__all__ = ["MergeOnReadWriter"]

_STAGED = pa.schema([("file", pa.int64()), ("pos", pa.int64())])


class MergeOnReadWriter(ChangeWriter):
    """Buffers and collapses changes as :class:`~sluice.sinks.tables.change_writer.ChangeWriter`; at
    pre-commit writes data files and stages old positions (module docstring)."""

    def __init__(self, options: IcebergSinkOptions, ctx: SinkContext) -> None:
        super().__init__(functools.partial(staging_storage, options), options.key_columns, ctx, options.compression)
        self.options = options
        self.fmt = IcebergFormat(options)
        self.backend = ctx.keyed_state()
        self.index = self.backend.batch_state(index_descriptor())
        self._layouts: dict[str, IcebergLayout] = {}
        self._rebuild = options.rebuild_index
        self._files_seq = 0

    def prepare_commit(self, checkpoint_id: int) -> list[TableFile]:
        if not self._buffer:
            if self._rebuild:  # no change yet: rebuild anyway, or this checkpoint would hold the stale index
                table = self.fmt.loaded()
                if table is not None:
                    self._rebuild = False
                    rebuild_index(self, table, None)
            return []
        changes = self._collapsed()
        self._buffer, self._rows, self._limit = [], 0, self.collapse_rows
        rows_schema = pa.schema([changes.schema.field(c) for c in row_columns(changes.schema)])
        layout = self._layout(rows_schema)
        table = self.fmt.loaded()
        location = table.location().rstrip("/")
        if self._resolved is None:
            self._resolved = arrow_filesystem(location, self.options.storage_options)
        fs, root = self._resolved
        key_columns = [changes.column(k) for k in self.keys]
        if self._rebuild:
            self._rebuild = False
            rebuild_index(self, table, [c.type for c in key_columns])
        keys = self.backend.key_batch(key_columns)
        present, old_files, old_pos = unpack(self.index.get(keys))
        is_delete = np.asarray(pc.equal(changes.column(OP), pa.scalar(int(Op.DELETE), pa.int8())).to_numpy(
            zero_copy_only=False), dtype=bool)  # fmt: skip
        upserted = np.flatnonzero(~is_delete)
        out: list[TableFile] = []
        if len(upserted):
            rows = changes.take(pa.array(upserted)).select(rows_schema.names)
            new_files = np.zeros(len(upserted), np.int64)
            new_pos = np.zeros(len(upserted), np.int64)
            sort = [(k, "ascending") for k in self.keys]
            for values, ppath, idx in layout.partition_rows(rows):
                part = rows.take(pa.array(idx))
                order = pc.sort_indices(part, sort_keys=sort).to_numpy()
                stored = layout.as_stored(part.take(pa.array(order)))
                name = data_file_name(
                    self.ctx.job_id, checkpoint_id, self.ctx.subtask, self.ctx.attempt, self._files_seq, self._run
                )
                self._files_seq += 1
                f = write_file(self.fmt, fs, root, values, ppath, name, stored, checkpoint_id)
                out.append(f)
                new_files[idx[order]] = file_id(f"{location}/{f.path}")
                new_pos[idx[order]] = np.arange(len(order))
            self.ctx.fault_hook("pre_commit")  # data files written, index not yet updated
            self.index.put(take_keys(keys, upserted), pack(new_files, new_pos))
        gone = np.flatnonzero(is_delete & present)
        if len(gone):
            self.index.delete(take_keys(keys, gone))
        if len(old_files):
            name = data_file_name(self.ctx.job_id, checkpoint_id, self.ctx.subtask, self.ctx.attempt, 0, self._run)
            rel = f"{CHANGES_DIR}/{name}"
            staged = pa.table([pa.array(old_files), pa.array(old_pos)], schema=_STAGED)
            write_parquet(fs, f"{root}/{rel}", staged, self.compression)
            size = int(fs.get_file_info(f"{root}/{rel}").size or 0)
            out.append(TableFile(rel, size, staged.num_rows, (), "", checkpoint_id, _STAGED))
        self.ctx.metric("mor_positions_deleted", len(old_files))
        return out

    def _layout(self, rows: pa.Schema) -> IcebergLayout:
        fp = schema_fingerprint(rows)
        if fp not in self._layouts:
            self._layouts[fp] = self.fmt.layout(rows)  # type: ignore[assignment]
        return self._layouts[fp]


def rebuild_index(writer: MergeOnReadWriter, table: Any, key_types: list[pa.DataType] | None) -> int:
    """Drop ``writer``'s index and read it from ``table``: every live row of the key groups the writer owns
    (its key columns cast to the stream's ``key_types``; None, before any change arrived: the data files'
    types, large strings and binaries as the plain ones a stream carries); returns the entries written. A key
    the table holds twice is refused (merge-on-read needs one row per key).

    Works file by file on whole arrays: each data file's key columns (its row positions are their row
    numbers), minus the positions its delete files name (each delete file read once), written to the index
    in bulk (:meth:`~sluice.state.spi.BatchValueState.insert`: sorted write batches past the cache on
    RocksDB). Keys held twice are found from the keys' 64-bit hashes (a repeated hash is checked against the
    keys themselves, in a second pass that only runs then)."""
    from pyiceberg.manifest import DataFileContent

    backend = writer.backend
    tasks = list(table.scan().plan_files())
    if any(d.content == DataFileContent.EQUALITY_DELETES for t in tasks for d in t.delete_files):
        raise ChangeError(
            f"IcebergSink {writer.options.table}: the table has equality delete files, which the index cannot "
            "be read from: compact them away (rewrite_data_files in Spark) first"
        )
    backend.drop_state(INDEX)
    writer.index = backend.batch_state(index_descriptor())
    fs, _ = arrow_filesystem(table.location(), writer.options.storage_options)
    deletes = _DeletedPositions(fs)
    hashes: list[np.ndarray[Any, Any]] = []
    for path, kb, at, key_hashes in _live_keys(writer, fs, tasks, deletes, key_types):
        writer.index.insert(kb, pack(np.full(len(at), file_id(path), np.int64), at.astype(np.int64)))
        hashes.append(key_hashes)
    entries = sum(len(h) for h in hashes)
    seen = np.sort(np.concatenate(hashes)) if hashes else np.zeros(0, np.uint64)
    repeated = np.unique(seen[1:][seen[1:] == seen[:-1]])
    if len(repeated):
        _refuse_repeated_keys(writer, fs, tasks, deletes, key_types, repeated)
    writer.ctx.metric("mor_index_rebuilt", entries)
    return entries


def _live_keys(
    writer: MergeOnReadWriter, fs: Any, tasks: list[Any], deletes: _DeletedPositions,
    key_types: list[pa.DataType] | None,
) -> Iterator[tuple[str, KeyBatch, np.ndarray[Any, Any], np.ndarray[Any, Any]]]:  # fmt: skip
    """Per data file of ``tasks`` with live rows in the writer's key groups: its path, those rows' keys, their
    positions and their keys' hashes."""
    backend, keys, owned = writer.backend, writer.keys, writer.backend.key_groups
    for task in tasks:
        path = task.file.file_path
        rows = pq.read_table(_in_fs(path), filesystem=fs, columns=keys)
        live = np.ones(rows.num_rows, bool)
        for positions in deletes.of(task):
            live[positions[positions < rows.num_rows]] = False
        types = key_types if key_types is not None else [_plain(rows.column(k).type) for k in keys]
        cols = [rows.column(k).cast(t) for k, t in zip(keys, types, strict=True)]
        batch = KeyBatch.of(cols, backend.max_parallelism)
        assert batch.hashes is not None  # KeyBatch.of hashes every key
        at = np.flatnonzero(live & (batch.key_groups >= owned.start) & (batch.key_groups < owned.end))
        if len(at):
            yield path, take_keys(batch, at), at, batch.hashes[at]


def _refuse_repeated_keys(
    writer: MergeOnReadWriter, fs: Any, tasks: list[Any], deletes: _DeletedPositions,
    key_types: list[pa.DataType] | None, repeated: np.ndarray[Any, Any],
) -> None:  # fmt: skip
    """Raise ChangeError naming a data file that holds a key another live row holds too, if any (the rows
    whose hash is in ``repeated``, compared by their encoded keys); else (hashes of distinct keys collided)
    return."""
    where: dict[bytes, str] = {}
    for path, kb, _, key_hashes in _live_keys(writer, fs, tasks, deletes, key_types):
        for i in np.flatnonzero(np.isin(key_hashes, repeated)).tolist():
            key = kb.keys[i]
            if key in where:
                raise ChangeError(
                    f"IcebergSink {writer.options.table}: the table holds a key twice (in {path}"
                    f"{'' if where[key] == path else ' and ' + where[key]}): merge-on-read needs one row per key; "
                    "deduplicate the table (a copy-on-write run) first"
                )
            where[key] = path


class _DeletedPositions:
    """The positions the position-delete files of a scan task name in its data file, each delete file read
    once (a delete file a commit writes names many data files of its partition)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self._by_file: dict[str, dict[str, np.ndarray[Any, Any]]] = {}

    def of(self, task: Any) -> list[np.ndarray[Any, Any]]:
        path = task.file.file_path
        out = []
        for d in task.delete_files:
            if d.file_path not in self._by_file:
                self._by_file[d.file_path] = self._read(d.file_path)
            positions = self._by_file[d.file_path].get(path)
            if positions is not None:
                out.append(positions)
        return out

    def _read(self, uri: str) -> dict[str, np.ndarray[Any, Any]]:
        rows = read_deletes(self.fs, _in_fs(uri))
        if rows.num_rows == 0:
            return {}
        grouped = rows.group_by("file_path").aggregate([("pos", "list")])
        paths = grouped.column("file_path").to_pylist()
        lists = grouped.column("pos_list").combine_chunks()
        values = np.asarray(lists.flatten().to_numpy(zero_copy_only=False), np.int64)
        offsets = np.asarray(lists.offsets.to_numpy(), np.int64) - int(lists.offsets[0].as_py())
        return {p: values[offsets[i] : offsets[i + 1]] for i, p in enumerate(paths)}


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    return t


def _in_fs(uri: str) -> str:
    """A table file's URI as a path in the pyarrow file system ``arrow_filesystem`` gives."""
    for prefix in ("file://", "s3://", "s3a://"):
        if uri.startswith(prefix):
            return uri[len(prefix) :]
    return uri
