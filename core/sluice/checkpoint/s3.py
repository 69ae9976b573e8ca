""":class:`S3CheckpointStorage`: checkpoints in ``s3://bucket/prefix`` (registered as the ``s3`` entry point of
``sluice.checkpoint_storage``).

Clients, retries of transient errors and the mapping of S3 errors to :class:`~sluice.errors.StorageError` come
from :mod:`sluice.io.s3`, which the file sink uses as well. Credentials are never logged.

How long an S3 checkpoint operation can take is bounded: the storage retries it for at most
``CheckpointConfig.storage_retry_timeout`` seconds (:meth:`~sluice.checkpoint.storage.CheckpointStorage.retrying`),
and its client makes one try per request (boto3's own retries are off, ``max_attempts=0``) with
``connect_timeout`` 5 s and ``read_timeout`` 20 s (a request that sends or receives nothing for that long
fails). Each of these three can be set in ``storage_options``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from sluice.checkpoint.storage import CheckpointStorage
from sluice.errors import StorageError
from sluice.io.s3 import MISSING, is_transient, list_pages, make_client, parse_s3_uri, s3_call

__all__ = ["CHECKPOINT_CLIENT_DEFAULTS", "S3CheckpointStorage"]

log = logging.getLogger("sluice.s3")

T = TypeVar("T")

#: client options of checkpoint storage unless ``storage_options`` say otherwise: the storage retries
#: (for storage_retry_timeout), so the client tries once, and a request that hangs fails in bounded time
CHECKPOINT_CLIENT_DEFAULTS = {"max_attempts": 0, "connect_timeout": 5.0, "read_timeout": 20.0}


class S3CheckpointStorage(CheckpointStorage):
    """Checkpoints in ``s3://bucket/prefix``: ``<prefix>/<job-id>/chk-<n>/...`` with ``_metadata`` last.

    The metadata file is written with a conditional put (``IfNoneMatch="*"``), so a checkpoint can never be
    completed twice; stores that do not implement conditional writes fall back to a plain put (logged).

    Args:
        uri: ``s3://bucket/prefix``.
        job_id: the job whose checkpoints these are.
        **options: client options (:data:`sluice.io.s3.S3_OPTIONS`), e.g. ``endpoint_url``, ``region_name``.
    """

    def __init__(self, uri: str, job_id: str, **options: Any) -> None:
        self.bucket, prefix = parse_s3_uri(uri)
        super().__init__(f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}", job_id)
        self._client = make_client({**CHECKPOINT_CLIENT_DEFAULTS, **options})
        self._conditional = True
        #: keys whose conditional put failed transiently: the put may have gone through all the same
        self._unsure: set[str] = set()

    def transient(self, error: BaseException) -> bool:
        return isinstance(error, StorageError) and error.__cause__ is not None and is_transient(error.__cause__)

    def _key(self, path: str) -> str:
        bucket, key = parse_s3_uri(path)
        if bucket != self.bucket:
            raise StorageError(
                f"{path!r} is outside checkpoint bucket {self.bucket!r}", operation="resolve", bucket=bucket
            )
        return key

    def _call(self, op: str, fn: Callable[..., T], **kw: Any) -> T:
        # one try: the storage's retrying() retries transient errors for a bounded time
        return s3_call(op, self.bucket, fn, attempts=1, Bucket=self.bucket, **kw)

    def write_file(self, path: str, data: bytes) -> None:
        self._call("PutObject", self._client.put_object, Key=self._key(path), Body=data)

    def read_file(self, path: str) -> bytes:
        def get(**kw: Any) -> bytes:
            return self._client.get_object(**kw)["Body"].read()  # type: ignore[no-any-return]

        try:
            return self._call("GetObject", get, Key=self._key(path))
        except StorageError as exc:
            if exc.code in ("NoSuchKey", "404"):
                raise FileNotFoundError(path) from exc
            raise

    def delete_file(self, path: str) -> None:
        self._call("DeleteObject", self._client.delete_object, Key=self._key(path))

    def upload_file(self, local_path: str, path: str) -> None:
        def put(**kw: Any) -> Any:
            with open(local_path, "rb") as body:  # opened per try: a retry sends the file again
                return self._client.put_object(Body=body, **kw)

        self._call("PutObject", put, Key=self._key(path))

    def download_file(self, path: str, local_path: str) -> None:
        def get(**kw: Any) -> None:
            body = self._client.get_object(**kw)["Body"]
            with open(local_path, "wb") as f:
                for chunk in iter(lambda: body.read(1 << 20), b""):
                    f.write(chunk)

        try:
            self._call("GetObject", get, Key=self._key(path))
        except StorageError as exc:
            if exc.code in ("NoSuchKey", "404"):
                raise FileNotFoundError(path) from exc
            raise

    def list_files(self, path: str) -> list[str]:
        prefix = self._key(path).rstrip("/") + "/"
        return sorted(o["Key"][len(prefix) :] for page in self._list(prefix, None) for o in page.get("Contents", []))

    def exists(self, path: str) -> bool:
        try:
            self._call("HeadObject", self._client.head_object, Key=self._key(path))
        except StorageError as exc:
            if exc.code in MISSING:
                return False
            raise
        return True

    def _list(self, prefix: str, delimiter: str | None) -> list[dict[str, Any]]:
        kw: dict[str, Any] = {"Prefix": prefix}
        if delimiter:
            kw["Delimiter"] = delimiter
        return list(list_pages(lambda **k: self._call("ListObjectsV2", self._client.list_objects_v2, **k), **kw))

    def list_dirs(self, path: str) -> list[str]:
        prefix = self._key(path).rstrip("/")
        prefix = f"{prefix}/" if prefix else ""
        names: set[str] = set()
        for page in self._list(prefix, "/"):
            names.update(p["Prefix"][len(prefix) :].rstrip("/") for p in page.get("CommonPrefixes", []))
            names.update(o["Key"][len(prefix) :] for o in page.get("Contents", []))
        return sorted(n for n in names if n)

    def delete_dir(self, path: str) -> None:
        prefix = self._key(path).rstrip("/") + "/"
        keys = [o["Key"] for page in self._list(prefix, None) for o in page.get("Contents", [])]
        for i in range(0, len(keys), 1000):
            objs = [{"Key": k} for k in keys[i : i + 1000]]
            self._call("DeleteObjects", self._client.delete_objects, Delete={"Objects": objs, "Quiet": True})

    def write_atomic(self, path: str, data: bytes) -> None:
        key = self._key(path)
        if self._conditional:
            try:
                self._call("PutObject", self._client.put_object, Key=key, Body=data, IfNoneMatch="*")
                self._unsure.discard(key)
                return
            except StorageError as exc:
                if exc.code in ("PreconditionFailed", "412") and key in self._unsure:
                    # a retry: the put whose answer was lost went through if the object holds our bytes
                    self._unsure.discard(key)
                    if self.read_file(path) == data:
                        return
                    raise
                if self.transient(exc):
                    self._unsure.add(key)
                if exc.code not in ("NotImplemented", "501"):
                    raise
                log.warning(
                    "s3://%s does not support conditional puts; writing metadata with a plain put",
                    self.bucket,
                )
                self._conditional = False
        self._call("PutObject", self._client.put_object, Key=key, Body=data)
