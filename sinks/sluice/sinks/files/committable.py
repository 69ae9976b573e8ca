"""What a file sink's checkpoint records about a staged file, and how staged and final files are named.

Names (relative to the sink's root, ``/``-separated)::

    <bucket>/part-<job>-<ckpt>-<subtask>-<seq>-<run><ext>                    visible (final)
    <bucket>/.part-<job>-<ckpt>-<subtask>-<seq>-<run><ext>.a<attempt>.pending staged at pre-commit (hidden)
    <bucket>/.part-<job>-x-<subtask>-<uuid><ext>.a<attempt>.inprogress        being written (hidden)

Compacted files use ``c<k>`` as ``<seq>``. ``<run>`` is a random token of the writer (or compactor)
instance, as Flink's FileSink puts a UUID in every part file: no two runs or attempts pick the same name, so
a file another run committed is never overwritten (nor taken for this run's), even when checkpoint ids
start again. The final name is fixed when the file is staged and travels in the committable, so every retry
of a commit, and the re-commit after a restore, publishes the same name. A leading ``.`` hides staged files
from Spark, Hive, Trino and ``pyarrow.dataset``.

The visible names are also the sink's lineage record: ``<ckpt>`` of the newest visible file of a job is the
newest checkpoint whose data the output holds (:func:`committed_checkpoint_of`). (Names of older versions,
without ``<run>``, still parse.)
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, replace

__all__ = [
    "FileCommittable",
    "committed_checkpoint_of",
    "final_name",
    "inprogress_name",
    "is_staging_of",
    "is_upload_of",
    "run_token",
    "staging_name",
]

_RUN = r"(?:-[0-9a-f]{12})?"
_STAGING_TAIL = re.compile(rf"^(\d+|x)-\d+-[0-9a-z]+{_RUN}(\.[a-z0-9]+)+\.a\d+\.(pending|inprogress)$")
_FINAL_TAIL = re.compile(rf"^(?P<ckpt>\d+)-\d+-[0-9a-z]+{_RUN}(\.[a-z0-9]+)+$")


@dataclass(frozen=True)
class FileCommittable:
    """A staged file and where it becomes visible. Picklable; goes into the checkpoint.

    Attributes:
        bucket: the bucket's relative directory (``""`` for the root).
        final: relative path of the visible file.
        staged: relative path of the hidden pending file (for an S3 multipart upload: the final key).
        size: bytes.
        rows: rows.
        checkpoint_id: the checkpoint whose pre-commit staged the file.
        schema_fp: fingerprint of the file's schema (compaction merges only equal schemas).
        upload_id: S3 multipart upload id when the file is an uncompleted multipart upload.
        parts: (part number, ETag) of that upload.
        held: kept back for compaction across checkpoints: committing it is a no-op; a later checkpoint
            publishes (or merges) it.
        replaces: staged files of earlier checkpoints merged into this one, deleted once it is visible.
    """

    bucket: str
    final: str
    staged: str
    size: int
    rows: int
    checkpoint_id: int
    schema_fp: str
    upload_id: str | None = None
    parts: tuple[tuple[int, str], ...] = ()
    held: bool = False
    replaces: tuple[str, ...] = ()

    def as_held(self, held: bool = True) -> FileCommittable:
        return replace(self, held=held)


def _join(bucket: str, name: str) -> str:
    return f"{bucket}/{name}" if bucket else name


def run_token() -> str:
    """A new random ``<run>`` token for the file names of one writer or compactor instance."""
    return uuid.uuid4().hex[:12]


def final_name(
    bucket: str, job_id: str, checkpoint_id: int, subtask: int, seq: str, ext: str, run: str
) -> str:
    """Relative path of a visible file; ``run`` from :func:`run_token`."""
    return _join(bucket, f"part-{job_id}-{checkpoint_id:06d}-{subtask:03d}-{seq}-{run}{ext}")


def inprogress_name(bucket: str, job_id: str, subtask: int, token: str, ext: str, attempt: int) -> str:
    """Relative path of a hidden in-progress file (its checkpoint is not known yet)."""
    return _join(bucket, f".part-{job_id}-x-{subtask:03d}-{token}{ext}.a{attempt}.inprogress")


def staging_name(final: str, attempt: int, kind: str) -> str:
    """Hidden sibling of ``final``: ``kind`` is ``pending`` or ``inprogress``."""
    bucket, _, base = final.rpartition("/")
    return _join(bucket, f".{base}.a{attempt}.{kind}")


def is_staging_of(basename: str, job_id: str) -> bool:
    """Whether ``basename`` is a hidden pending or in-progress file of ``job_id`` (exactly, not a prefix)."""
    head = f".part-{job_id}-"
    return basename.startswith(head) and bool(_STAGING_TAIL.match(basename[len(head) :]))


def is_upload_of(basename: str, job_id: str) -> bool:
    """Whether ``basename`` is a final name of ``job_id`` (the key of a multipart upload)."""
    head = f"part-{job_id}-"
    return basename.startswith(head) and bool(_FINAL_TAIL.match(basename[len(head) :]))


def committed_checkpoint_of(basename: str, job_id: str) -> int | None:
    """The checkpoint of a visible (final) file of ``job_id``, or None if ``basename`` is not one."""
    head = f"part-{job_id}-"
    m = _FINAL_TAIL.match(basename[len(head) :]) if basename.startswith(head) else None
    return int(m.group("ckpt")) if m else None
