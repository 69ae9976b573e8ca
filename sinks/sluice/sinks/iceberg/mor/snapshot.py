"""One Iceberg snapshot that adds data files and position-delete files and removes files of both kinds: the
row delta of a merge-on-read checkpoint, and the replace of the rewrite that folds deletes into data files.

pyiceberg 0.12 writes only data manifests: its snapshot producers put every added file in a manifest of
content ``data`` and cannot remove delete files. :class:`RowDelta` is a snapshot producer of its own on
pyiceberg's internal ``_SnapshotProducer`` (its manifest list, summary and commit steps), writing delete
files into manifests of content ``deletes`` as the spec asks. That internal API is pinned by the version
range of the ``iceberg`` extra and checked by ``tests/sinks/tables/test_mor_snapshot.py``
(:func:`check_pyiceberg`).

A commit that finds another commit landed since its base (pyiceberg 0.12 rebases a snapshot on a lost
compare-and-swap by itself) fails with ``ValidationException`` instead: the caller reads the table again,
checks whose commit it was and computes its deletes again, since positions are only meaningful against the
snapshot they were computed for.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sluice.errors import ConfigError

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile, ManifestEntry, ManifestFile
    from pyiceberg.table import Table

__all__ = ["RowDelta", "check_pyiceberg", "commit_files"]

#: the pyiceberg releases whose internals RowDelta was written against (pyproject's ``iceberg`` extra)
TESTED = ((0, 12), (0, 13))


def check_pyiceberg() -> None:
    """ConfigError naming the version unless pyiceberg's snapshot internals are the ones RowDelta uses."""
    import pyiceberg
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2
    from pyiceberg.table.update import snapshot

    version = tuple(int(p) for p in pyiceberg.__version__.split(".")[:2] if p.isdigit())
    needed = ("_manifests", "_summary", "_commit", "_validate_concurrency", "new_manifest_output", "_snapshot_id")
    producer = snapshot._SnapshotProducer
    missing = [n for n in needed[:-1] if not hasattr(producer, n)]
    if (
        not (TESTED[0] <= version < TESTED[1])
        or missing
        or not hasattr(ManifestWriterV2, "content")
        or not hasattr(ManifestContent, "DELETES")
    ):
        raise ConfigError(
            f"IcebergSink: write_mode='merge-on-read' commits delete files through pyiceberg internals tested "
            f"with pyiceberg {'.'.join(map(str, TESTED[0]))}.x; this is pyiceberg {pyiceberg.__version__}"
            + (f" (missing: {missing})" if missing else "")
            + ": install pyiceberg>=0.12,<0.13 or use write_mode='copy-on-write'"
        )


def _writer(producer: Any, spec: Any, deletes: bool) -> Any:
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2

    class _DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    cls = _DeleteManifestWriter if deletes else ManifestWriterV2
    return cls(
        spec=spec,
        schema=producer.schema(),
        output_file=producer.new_manifest_output(),
        snapshot_id=producer.snapshot_id,
        avro_compression=producer._compression,
    )


def _producer_class() -> type:
    from pyiceberg.exceptions import ValidationException
    from pyiceberg.manifest import DataFileContent, ManifestEntry, ManifestEntryStatus
    from pyiceberg.table.snapshots import Operation, Summary
    from pyiceberg.table.update.snapshot import _SnapshotProducer
    from pyiceberg.typedef import EMPTY_DICT

    class _RowDelta(_SnapshotProducer["_RowDelta"]):
        """See :class:`RowDelta`."""

        def __init__(
            self,
            operation: Any,
            transaction: Any,
            io: Any,
            properties: Mapping[str, str],
            added: list[DataFile],
            removed: set[str],
            consolidate: bool,
        ) -> None:
            super().__init__(operation, transaction, io, snapshot_properties=dict(properties))
            self._added_data_files = list(added)
            self._removed = set(removed)
            self._consolidate = consolidate or bool(removed)
            self._deleted: list[ManifestEntry] = []

        def _existing_manifests(self) -> list[ManifestFile]:
            return []

        def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Any:
            # pyiceberg totals the summary of append, overwrite and delete only: a replace is totalled as an
            # overwrite (same files in, same files out), then named what it is
            operation = self._operation
            if operation == Operation.REPLACE:
                self._operation = Operation.OVERWRITE
            try:
                summary = super()._summary(snapshot_properties)
            finally:
                self._operation = operation
            if summary.operation == operation:
                return summary
            return Summary(operation=operation, **summary.additional_properties)

        def _deleted_entries(self) -> list[ManifestEntry]:
            return []

        def _validate_concurrency(self) -> None:
            window = self._commit_window
            if window is not None and not window.is_empty():
                raise ValidationException(
                    "another commit landed since this snapshot's base: its positions must be computed again"
                )

        def _write(self, spec_id: int, deletes: bool, entries: Iterable[tuple[str, ManifestEntry]]) -> ManifestFile:
            writer = _writer(self, self.spec(spec_id), deletes)
            with writer:
                for how, entry in entries:
                    getattr(writer, how)(entry)
            manifest: ManifestFile = writer.to_manifest_file()
            return manifest

        def _manifests(self) -> list[ManifestFile]:
            meta = self._transaction.table_metadata
            parent = meta.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id is not None else None
            out: list[ManifestFile] = []
            kept: dict[tuple[int, bool], list[tuple[str, ManifestEntry]]] = defaultdict(list)
            for manifest in parent.manifests(io=self._io) if parent is not None else []:
                if not self._consolidate:
                    if manifest.has_added_files() or manifest.has_existing_files():
                        out.append(manifest)
                    continue
                for entry in manifest.fetch_manifest_entry(io=self._io, discard_deleted=True):
                    is_delete = entry.data_file.content != DataFileContent.DATA
                    key = (manifest.partition_spec_id, is_delete)
                    if entry.data_file.file_path in self._removed:
                        self._deleted_data_files.add(entry.data_file)
                        kept[key].append(("delete", entry))
                    else:
                        kept[key].append(("existing", entry))
            found = {f.file_path for f in self._deleted_data_files}
            if missing := self._removed - found:
                raise ValidationException(f"files to remove are not in the table: {sorted(missing)[:3]}")
            for (spec_id, is_delete), entries in kept.items():
                out.append(self._write(spec_id, is_delete, entries))
            for group, files in itertools.groupby(
                sorted(self._added_data_files, key=lambda f: (f.spec_id, f.content != DataFileContent.DATA)),
                key=lambda f: (f.spec_id, f.content != DataFileContent.DATA),
            ):
                spec_id, deletes = group
                added = [
                    (
                        "add_entry",
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=None,
                            file_sequence_number=None,
                            data_file=f,
                        ),
                    )
                    for f in files
                ]
                out.insert(0, self._write(spec_id, deletes, added))
            return out

    return _RowDelta


class RowDelta:
    """Builds the producer: ``added`` data and delete files, ``removed`` files (absolute paths, of either
    kind); ``consolidate`` rewrites every live manifest entry into one manifest per spec and content (the
    rewrite's cleanup: readers then read few manifests however many checkpoints came before)."""

    _cls: type | None = None

    @classmethod
    def producer(
        cls,
        operation: Any,
        transaction: Any,
        io: Any,
        properties: Mapping[str, str],
        added: list[DataFile],
        removed: set[str] = frozenset(),  # type: ignore[assignment]
        consolidate: bool = False,
    ) -> Any:
        if cls._cls is None:
            check_pyiceberg()
            cls._cls = _producer_class()
        return cls._cls(operation, transaction, io, properties, added, set(removed), consolidate)


def commit_files(
    table: Table,
    operation: Any,
    properties: Mapping[str, str],
    added: list[DataFile],
    removed: set[str] = frozenset(),  # type: ignore[assignment]
    consolidate: bool = False,
) -> int:
    """Commit one snapshot of ``added`` and ``removed`` files; returns its id. Raises
    ``CommitFailedException`` / ``ValidationException`` when another commit landed first (nothing landed)."""
    with table.transaction() as tx:
        producer = RowDelta.producer(operation, tx, table.io, properties, added, removed, consolidate)
        producer.commit()
        snapshot_id: int = producer.snapshot_id
    return snapshot_id
