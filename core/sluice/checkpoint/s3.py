"""S3 plumbing shared by the file sink and :class:`S3CheckpointStorage` (registered as the ``s3`` entry point
of ``sluice.checkpoint_storage``).

Clients come from boto3 with the standard AWS credential chain unless options name credentials; the
endpoint can be set with ``endpoint_url`` or boto3's own ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``
environment variables. Transient errors (throttling, 5xx, connection failures and timeouts) are retried
with tenacity; anything else becomes a :class:`~sluice.errors.StorageError` naming the bucket and the
operation. Credentials are never logged.

How long an S3 checkpoint operation can take is bounded: the storage retries it for at most
``CheckpointConfig.storage_retry_timeout`` seconds (:meth:`~sluice.checkpoint.storage.CheckpointStorage.retrying`),
and its client makes one try per request (boto3's own retries are off, ``max_attempts=0``) with
``connect_timeout`` 5 s and ``read_timeout`` 20 s (a request that sends or receives nothing for that long
fails). Each of these three can be set in ``storage_options``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import tenacity

from sluice.checkpoint.storage import CheckpointStorage
from sluice.errors import ConfigError, StorageError

__all__ = ["S3_OPTIONS", "S3CheckpointStorage", "make_client", "parse_s3_uri", "s3_call"]

log = logging.getLogger("sluice.s3")

T = TypeVar("T")

#: options accepted by :func:`make_client` (everything else is a ConfigError)
S3_OPTIONS = (
    "endpoint_url",
    "region_name",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "profile_name",
    "max_attempts",
    "connect_timeout",
    "read_timeout",
)
#: client options of checkpoint storage unless ``storage_options`` say otherwise: the storage retries
#: (for storage_retry_timeout), so the client tries once, and a request that hangs fails in bounded time
CHECKPOINT_CLIENT_DEFAULTS = {"max_attempts": 0, "connect_timeout": 5.0, "read_timeout": 20.0}

_SESSIONS: dict[str | None, Any] = {}
_SESSIONS_LOCK = threading.Lock()
_TRANSIENT = {
    "SlowDown",
    "InternalError",
    "ServiceUnavailable",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "Throttling",
    "ThrottlingException",
    "500",
    "502",
    "503",
    "504",
}
_HINTS = {
    "AccessDenied": "check that the credentials may perform this operation on the bucket",
    "NoSuchBucket": "create the bucket or fix the path",
    "InvalidAccessKeyId": "check the AWS credentials",
    "SignatureDoesNotMatch": "check the AWS credentials",
}


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Split ``s3://bucket/prefix`` into (bucket, prefix without surrounding slashes)."""
    if not uri.startswith("s3://"):
        raise ConfigError(f"expected an s3://bucket/prefix URI (got {uri!r})")
    bucket, _, prefix = uri[5:].partition("/")
    if not bucket:
        raise ConfigError(f"{uri!r} names no bucket (expected s3://bucket/prefix)")
    return bucket, prefix.strip("/")


def make_client(options: dict[str, Any]) -> Any:
    """A boto3 S3 client from ``options`` (see :data:`S3_OPTIONS`); unset ones come from the AWS chain."""
    import boto3
    from botocore.config import Config

    unknown = sorted(set(options) - set(S3_OPTIONS))
    if unknown:
        raise ConfigError(f"s3 options: unknown option(s) {unknown} (allowed: {', '.join(S3_OPTIONS)})")
    opts = dict(options)
    profile = opts.pop("profile_name", None)
    retries = {"max_attempts": int(opts.pop("max_attempts", 3)), "mode": "standard"}
    timeouts = {k: float(opts.pop(k)) for k in ("connect_timeout", "read_timeout") if k in opts}
    with _SESSIONS_LOCK:  # a session loads the service models once; creating clients is not thread-safe
        session = _SESSIONS.get(profile)
        if session is None:
            session = _SESSIONS[profile] = boto3.session.Session(profile_name=profile)
        return session.client("s3", config=Config(retries=retries, **timeouts), **opts)


def _code(exc: BaseException) -> str:
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        return str(resp.get("Error", {}).get("Code", "")) or str(
            resp.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        )
    return ""


def _transient(exc: BaseException) -> bool:
    from botocore.exceptions import (
        ClientError,
        ConnectionError,
        HTTPClientError,
        IncompleteReadError,
        SSLError,
    )

    # connection refused, reset or timed out, a response cut short; not a TLS error (a wrong certificate)
    if isinstance(exc, ConnectionError | HTTPClientError | IncompleteReadError):
        return not isinstance(exc, SSLError)
    return isinstance(exc, ClientError) and _code(exc) in _TRANSIENT


def s3_call(operation: str, bucket: str, fn: Callable[..., T], /, *, attempts: int = 5, **kwargs: Any) -> T:
    """``fn(**kwargs)`` with tenacity retries of transient errors; other failures raise StorageError."""
    try:
        for attempt in tenacity.Retrying(
            stop=tenacity.stop_after_attempt(attempts),
            wait=tenacity.wait_exponential(multiplier=0.05, max=2.0),
            retry=tenacity.retry_if_exception(_transient),
            reraise=True,
        ):
            with attempt:
                return fn(**kwargs)
    except Exception as exc:
        from botocore.exceptions import BotoCoreError, ClientError

        if not isinstance(exc, ClientError | BotoCoreError):
            raise
        code = _code(exc)
        hint = _HINTS.get(code, "")
        raise StorageError(
            f"S3 {operation} on bucket {bucket!r} failed: {code or type(exc).__name__}: {exc}"
            + (f" ({hint})" if hint else ""),
            operation=operation,
            bucket=bucket,
            code=code,
        ) from exc
    raise AssertionError("unreachable")  # pragma: no cover


class S3CheckpointStorage(CheckpointStorage):
    """Checkpoints in ``s3://bucket/prefix``: ``<prefix>/<job-id>/chk-<n>/...`` with ``_metadata`` last.

    The metadata file is written with a conditional put (``IfNoneMatch="*"``), so a checkpoint can never be
    completed twice; stores that do not implement conditional writes fall back to a plain put (logged).

    Args:
        uri: ``s3://bucket/prefix``.
        job_id: the job whose checkpoints these are.
        **options: client options (:data:`S3_OPTIONS`), e.g. ``endpoint_url``, ``region_name``.
    """

    def __init__(self, uri: str, job_id: str, **options: Any) -> None:
        self.bucket, prefix = parse_s3_uri(uri)
        super().__init__(f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}", job_id)
        self._client = make_client({**CHECKPOINT_CLIENT_DEFAULTS, **options})
        self._conditional = True
        #: keys whose conditional put failed transiently: the put may have gone through all the same
        self._unsure: set[str] = set()

    def transient(self, error: BaseException) -> bool:
        return isinstance(error, StorageError) and error.__cause__ is not None and _transient(error.__cause__)

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

    def exists(self, path: str) -> bool:
        try:
            self._call("HeadObject", self._client.head_object, Key=self._key(path))
        except StorageError as exc:
            if exc.code in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def _list(self, prefix: str, delimiter: str | None) -> list[dict[str, Any]]:
        pages = []
        kw: dict[str, Any] = {"Prefix": prefix}
        if delimiter:
            kw["Delimiter"] = delimiter
        while True:
            page = self._call("ListObjectsV2", self._client.list_objects_v2, **kw)
            pages.append(page)
            if not page.get("IsTruncated"):
                return pages
            kw["ContinuationToken"] = page["NextContinuationToken"]

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

    def append_line(self, path: str, line: str) -> None:
        """Read-modify-write (S3 has no append): fine for the small, single-writer stats file. A retry
        after a put whose answer was lost does not add the line twice."""
        try:
            old = self.read_file(path)
        except FileNotFoundError:
            old = b""
        new = line.encode() + b"\n"
        if old.endswith(new) and (len(old) == len(new) or old[-len(new) - 1 : -len(new)] == b"\n"):
            return
        self.write_file(path, old + new)
