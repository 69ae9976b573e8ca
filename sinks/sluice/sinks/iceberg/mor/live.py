"""What the merge-on-read committer knows of the table: its live data files by file id (kept between commits,
read from the manifests again only when the table moved in a way the committer did not see), and whose
snapshots the table holds since the index's base (:func:`foreign_snapshots`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.sinks.iceberg.layout import JOB_ID, SINK_UID
from sluice.sinks.iceberg.mor.positions import file_id
from sluice.sinks.tables.errors import TableLineageError

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

__all__ = ["IndexLineageError", "LiveFiles", "foreign_snapshots"]


class IndexLineageError(TableLineageError):
    """The merge-on-read index does not describe the table: another writer committed to it since the
    index's base (its positions may point at other rows now), or the job starts on a table that holds rows
    its index never saw. Set ``rebuild_index=True`` to build the index from the table at the next start."""


@dataclass
class LiveFiles:
    """The live data files of the table at snapshot ``snapshot_id``, by file id."""

    snapshot_id: int | None
    files: dict[int, DataFile] = field(default_factory=dict)

    @classmethod
    def of(cls, table: Table) -> LiveFiles:
        """Read from the manifests of the table's current snapshot (data manifests only)."""
        from pyiceberg.manifest import ManifestContent
        from pyiceberg.utils.concurrent import ExecutorFactory

        snapshot = table.current_snapshot()
        live = cls(snapshot.snapshot_id if snapshot is not None else None)
        if snapshot is None:
            return live
        manifests = [m for m in snapshot.manifests(table.io) if m.content == ManifestContent.DATA]
        pool = ExecutorFactory.get_or_create()
        for entries in pool.map(lambda m: m.fetch_manifest_entry(table.io, discard_deleted=True), manifests):
            for e in entries:
                live.add(e.data_file)
        return live

    def add(self, f: DataFile) -> int:
        """Know ``f`` as live; returns its id (a second live file of that id is refused)."""
        fid = file_id(f.file_path)
        have = self.files.get(fid)
        if have is not None and have.file_path != f.file_path:
            raise TableLineageError(
                f"two live data files share the merge-on-read file id {fid}: {have.file_path} and {f.file_path} "
                "(a 64-bit hash collision): rewrite the table (a copy-on-write run) and rebuild the index"
            )
        self.files[fid] = f
        return fid

    def __contains__(self, fid: int) -> bool:
        return fid in self.files


def _ours(summary: Any, job_id: str, sink_uid: str) -> bool:
    props = summary.additional_properties if summary is not None else {}
    return bool(props.get(JOB_ID) == job_id and props.get(SINK_UID) == sink_uid)


def foreign_snapshots(table: Table, job_id: str, sink_uid: str, base: int | None) -> tuple[list[Any], bool]:
    """The snapshots from the current one back to the newest of this job and sink (or to ``base``) that are
    not this job's and sink's, newest first, and whether such a snapshot (or ``base``) was reached."""
    out: list[Any] = []
    snapshot = table.current_snapshot()
    while snapshot is not None:
        if snapshot.snapshot_id == base or _ours(snapshot.summary, job_id, sink_uid):
            return out, True
        out.append(snapshot)
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return out, False


def has_rows(table: Table) -> bool:
    """Whether the table's current snapshot holds rows."""
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return False
    return int(snapshot.summary.additional_properties.get("total-records", "1") or 0) > 0
