"""The file sink on S3: multipart uploads completed at commit, small files as hidden objects copied at commit.

* In-progress files are written to a local temporary folder.
* Pre-commit (``stage``): a file of at least ``multipart_threshold`` bytes is uploaded as the parts of a
  multipart upload of its **final** key, which stays invisible until completed; a smaller one is put under
  its hidden pending key.
* Commit (``publish``): ``CompleteMultipartUpload`` (a no-op when the upload is already completed and the
  object exists with the expected multipart ETag), or ``CopyObject`` pending -> final then delete pending
  (a no-op when the final object exists).
* ``cleanup``: deletes hidden staged objects and aborts multipart uploads of the job that the restored
  checkpoint does not name.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from typing import Any

import pyarrow as pa
from sluice.errors import CommitError
from sluice.io.s3 import MISSING, list_pages, make_client, parse_s3_uri, s3_call
from sluice.sinks.files.committable import (
    FileCommittable,
    committed_checkpoint_of,
    is_staging_of,
    is_upload_of,
)
from sluice.sinks.files.errors import StorageError
from sluice.sinks.files.filesystem import FileSystem, Staged, local_tmp_dir

__all__ = ["S3FileSystem"]


def _multipart_etag(parts: tuple[tuple[int, str], ...]) -> str:
    digest = hashlib.md5(b"".join(bytes.fromhex(e.strip('"')) for _, e in parts))
    return f'"{digest.hexdigest()}-{len(parts)}"'


class S3FileSystem(FileSystem):
    """``s3://bucket/prefix`` through boto3.

    Args:
        root: ``s3://bucket/prefix``.
        options: client options (``sluice.io.s3.S3_OPTIONS``).
        multipart_threshold: files of at least this many bytes become multipart uploads.
        part_size: bytes per uploaded part (S3: >= 5 MiB except the last).
        local_tmp: where in-progress files are written (default: the system temp folder).
    """

    def __init__(
        self,
        root: str,
        options: dict[str, Any],
        multipart_threshold: int,
        part_size: int,
        local_tmp: str | None,
    ) -> None:
        self.root = root.rstrip("/")
        self.bucket, self.prefix = parse_s3_uri(root)
        self.client = make_client(dict(options))
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self._tmp = local_tmp_dir(local_tmp)

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def _call(self, op: str, fn: Any, **kw: Any) -> Any:
        return s3_call(op, self.bucket, fn, Bucket=self.bucket, **kw)

    def inprogress_path(self, rel: str) -> str:
        return os.path.join(self._tmp, rel.replace("/", "__"))

    def stage(self, local_path: str, pending: str, final: str) -> Staged:
        size = os.path.getsize(local_path)
        try:
            if size < self.multipart_threshold:
                with open(local_path, "rb") as f:
                    self._call("PutObject", self.client.put_object, Key=self._key(pending), Body=f)
                return Staged(pending)
            key = self._key(final)
            upload_id = self._call("CreateMultipartUpload", self.client.create_multipart_upload, Key=key)[
                "UploadId"
            ]
            parts = []
            with open(local_path, "rb") as f:
                n = 1
                while chunk := f.read(self.part_size):
                    resp = self._call(
                        "UploadPart",
                        self.client.upload_part,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=n,
                        Body=chunk,
                    )
                    parts.append((n, str(resp["ETag"])))
                    n += 1
            return Staged(final, upload_id, tuple(parts))
        finally:
            self.discard_local(local_path)

    def open_staged(self, c: FileCommittable) -> pa.NativeFile:
        if c.upload_id is not None:
            raise StorageError(
                f"{c.final} is an uncompleted multipart upload and cannot be read",
                operation="GetObject",
                bucket=self.bucket,
            )
        body = self._call("GetObject", self.client.get_object, Key=self._key(c.staged))["Body"].read()
        return pa.BufferReader(body)

    def _head(self, key: str) -> dict[str, Any] | None:
        try:
            return self._call("HeadObject", self.client.head_object, Key=key)  # type: ignore[no-any-return]
        except StorageError as exc:
            if exc.code in MISSING:
                return None
            raise

    def publish(self, c: FileCommittable) -> bool:
        final = self._key(c.final)
        if c.upload_id is not None:
            published = self._complete(c, final)
        else:
            published = self._copy(c, final)
            self.delete_staged(c.staged)
        for r in c.replaces:
            self.delete_staged(r)
        return published

    def _copy(self, c: FileCommittable, final: str) -> bool:
        """Copy pending -> final (True); copying again is harmless, a missing pending file means done
        (False) or lost (CommitError)."""
        try:
            self._call(
                "CopyObject",
                self.client.copy_object,
                Key=final,
                CopySource={"Bucket": self.bucket, "Key": self._key(c.staged)},
            )
            return True
        except StorageError as exc:
            if exc.code not in ("NoSuchKey", "404"):
                raise
            if self._head(final) is None:
                raise CommitError(
                    f"file sink: s3://{self.bucket}/{final} is neither pending nor committed: "
                    "its data is lost"
                ) from exc
            return False

    def _complete(self, c: FileCommittable, final: str) -> bool:
        parts = [{"PartNumber": n, "ETag": e} for n, e in c.parts]
        # already completed (a retry or a re-commit after restore)? S3 may accept completing an upload
        # again for a while, so ask first: the commit must say ALREADY_COMMITTED then
        head = self._head(final)
        if head is None:
            try:
                self._call(
                    "CompleteMultipartUpload",
                    self.client.complete_multipart_upload,
                    Key=final,
                    UploadId=c.upload_id,
                    MultipartUpload={"Parts": parts},
                )
                return True
            except StorageError as exc:
                if exc.code != "NoSuchUpload":
                    raise
            head = self._head(final)
        if head is None:
            raise CommitError(
                f"file sink: multipart upload {c.upload_id} of s3://{self.bucket}/{final} is gone "
                "and the object does not exist: its data is lost (aborted by a lifecycle rule?)"
            )
        if head.get("ETag") != _multipart_etag(c.parts):
            raise CommitError(
                f"file sink: s3://{self.bucket}/{final} exists but is not the object of upload "
                f"{c.upload_id} (ETag {head.get('ETag')} != {_multipart_etag(c.parts)})"
            )
        return False

    def delete_staged(self, rel: str) -> None:
        self._call("DeleteObject", self.client.delete_object, Key=self._key(rel))

    def _pages(self, operation: str, fn: Any) -> Any:
        prefix = f"{self.prefix}/" if self.prefix else ""
        return list_pages(lambda **kw: self._call(operation, fn, **kw), Prefix=prefix)

    def cleanup(self, job_id: str, keep: set[str]) -> int:
        skip = len(f"{self.prefix}/") if self.prefix else 0
        n = 0
        for page in self._pages("ListObjectsV2", self.client.list_objects_v2):
            for o in page.get("Contents", []):
                rel = o["Key"][skip:]
                if is_staging_of(rel.rpartition("/")[2], job_id) and rel not in keep:
                    self.delete_staged(rel)
                    n += 1
        for page in self._pages("ListMultipartUploads", self.client.list_multipart_uploads):
            for u in page.get("Uploads", []):
                rel = u["Key"][skip:]
                if is_upload_of(rel.rpartition("/")[2], job_id) and u["UploadId"] not in keep:
                    try:
                        self._call(
                            "AbortMultipartUpload",
                            self.client.abort_multipart_upload,
                            Key=u["Key"],
                            UploadId=u["UploadId"],
                        )
                    except StorageError as exc:
                        if exc.code != "NoSuchUpload":
                            raise
                    n += 1
        return n

    def probe(self) -> None:
        key = self._key(f".sluice-probe-{uuid.uuid4().hex}")
        self._call("PutObject", self.client.put_object, Key=key, Body=b"sluice")
        self._call("DeleteObject", self.client.delete_object, Key=key)

    def committed_checkpoint(self, job_id: str) -> int:
        newest = 0
        for page in self._pages("ListObjectsV2", self.client.list_objects_v2):
            for o in page.get("Contents", []):
                newest = max(newest, committed_checkpoint_of(o["Key"].rpartition("/")[2], job_id) or 0)
        return newest

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)
