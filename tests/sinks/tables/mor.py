"""Merge-on-read under test: the primary-key index read out of a completed checkpoint (the keyed state of the
sink's writers, restored into a backend over every key group) and compared with the table read apart from
the sink (every live row's data file and position: the file's rows minus the positions its delete files
name), and the position-delete files on storage compared with those the table's snapshots name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.runtime.restore import RestoredCheckpoint
from sluice.sinks.iceberg.mor.maps import RewriteMaps
from sluice.sinks.iceberg.mor.positions import INDEX, file_id, index_descriptor, unpack
from sluice.sinks.tables.storage import arrow_filesystem
from sluice.state.config import StateBackendConfig
from sluice.state.factory import state_backend_for
from sluice.state.keygroups import KeyGroupRange
from sluice.state.spi import KeyBatch
from sluice.state.transfer import LocalFileTransfer

from tests.sinks.tables.helpers import Target

__all__ = ["MOR", "check_index", "index_in_checkpoint", "live_rows", "orphan_deletes"]

#: the sink options of merge-on-read upserts keyed by ``id``
MOR: dict[str, Any] = {"write_mode": "merge-on-read", "key_columns": ["id"]}


def _path(uri: str) -> str:
    for prefix in ("file://", "s3://"):
        if uri.startswith(prefix):
            return uri[len(prefix) :]
    return uri


def live_rows(target: Target) -> dict[int, tuple[int, int]]:
    """``{id: (file id, position)}`` of every live row of the table's current snapshot (read with pyarrow:
    each data file's ids, minus the positions its delete files name); a key twice fails."""
    table = target.iceberg_table()
    fs, _ = arrow_filesystem(target.root, target.storage_options)
    out: dict[int, tuple[int, int]] = {}
    for task in table.scan().plan_files():
        ids = pq.read_table(_path(task.file.file_path), filesystem=fs, columns=["id"]).column("id").to_numpy()
        live = np.ones(len(ids), bool)
        for d in task.delete_files:
            rows = pq.read_table(_path(d.file_path), filesystem=fs)
            pos = rows.filter(pc.equal(rows.column("file_path"), task.file.file_path)).column("pos").to_numpy()
            live[pos] = False
        fid = file_id(task.file.file_path)
        for p in np.flatnonzero(live).tolist():
            key = int(ids[p])
            assert key not in out, f"key {key} is live twice in the table"
            out[key] = (fid, p)
    return out


def index_in_checkpoint(chk: str, job: str, path: str | None = None) -> dict[int, tuple[int, int]]:
    """The index the sink's writers hold in the latest completed checkpoint of ``job`` under ``chk`` (or the
    one at ``path``): ``{id: (file id, position)}``."""
    from sluice.config import CheckpointConfig

    storage = checkpoint_storage(chk, job)
    path = path or storage.latest()
    assert path is not None, "no completed checkpoint"
    rc = RestoredCheckpoint.load(storage, path, key=CheckpointConfig().resolved_key())
    max_par = int(rc.metadata["job"]["max_parallelism"]) if "job" in rc.metadata else 128
    handles: list[dict[str, Any]] = []
    for t in rc.tasks:
        for uid, op in t.payload["operators"].items():
            keyed = op.get("keyed")
            if keyed and "writer" in (op.get("operator") or {}):
                handles.append(rc._keyed_handle(uid, t))  # type: ignore[arg-type]
    handles = [h for h in handles if h is not None]
    if not handles:
        return {}
    import tempfile

    backend = state_backend_for(StateBackendConfig()).create_keyed_backend(
        "index-check", KeyGroupRange(0, max_par), max_par, LocalFileTransfer(tempfile.mkdtemp()), None
    )
    backend.restore(handles)
    keys = [int(k) for _, k in backend.keys(INDEX)]
    if not keys:
        return {}
    import pyarrow as pa

    present, files, positions = unpack(backend.batch_state(index_descriptor()).get(KeyBatch.of([pa.array(keys, pa.int64())], max_par)))
    assert present.all()
    backend.dispose()
    return {k: (int(f), int(p)) for k, f, p in zip(keys, files.tolist(), positions.tolist(), strict=True)}


def check_index(target: Target, index: dict[int, tuple[int, int]]) -> None:
    """Every index entry, translated through the committed rewrite maps, is the live row of its key, and
    every live row has its entry: no entry for a row that is not in the table, no row the index misses."""
    rows = live_rows(target)
    assert set(index) == set(rows), (
        f"index keys not in the table: {sorted(set(index) - set(rows))[:5]}, "
        f"table keys not in the index: {sorted(set(rows) - set(index))[:5]}"
    )
    if not index:
        return
    live_files = {f for f, _ in rows.values()}
    keys = sorted(index)
    files = np.array([index[k][0] for k in keys], np.int64)
    pos = np.array([index[k][1] for k in keys], np.int64)
    fs, root = arrow_filesystem(target.iceberg_table().location().rstrip("/"), target.storage_options)
    files, pos, lost = RewriteMaps(fs, root).translate(files, pos, live_files.__contains__)
    assert not lost, f"index entries in files no committed rewrite moved: {lost}"
    wrong = [k for k, f, p in zip(keys, files.tolist(), pos.tolist(), strict=True) if rows[k] != (f, p)]
    assert not wrong, f"{len(wrong)} index entries point at another row than their key's: {wrong[:5]}"


def orphan_deletes(target: Target) -> list[str]:
    """Position-delete files on storage that no snapshot of the table names."""
    table = target.iceberg_table()
    named: set[str] = set()
    for s in table.snapshots():
        for m in s.manifests(table.io):
            named |= {e.data_file.file_path for e in m.fetch_manifest_entry(table.io, discard_deleted=False)}
    fs, root = arrow_filesystem(table.location().rstrip("/"), target.storage_options)
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/data", recursive=True, allow_not_found=True))
    location = table.location().rstrip("/")
    return [
        i.path for i in infos
        if i.type == pafs.FileType.File and i.base_name.startswith("delete-")
        and f"{location}/{i.path[len(root):].lstrip('/')}" not in named
    ]  # fmt: skip
