"""S3 plumbing shared by the file sink and the checkpoint storage: clients, retries, errors, listings.

Clients come from boto3 with the standard AWS credential chain unless options name credentials; the
endpoint can be set with ``endpoint_url`` or boto3's own ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``
environment variables. :func:`s3_call` retries transient errors (throttling, 5xx, connection failures and
timeouts: :func:`is_transient`) with tenacity; anything else becomes a :class:`~sluice.errors.StorageError`
naming the bucket and the operation, with the service's error code in ``.code``. Credentials are never
logged.

A leaf module: it imports only :mod:`sluice.errors` (and boto3 / botocore lazily, when a client is made).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import tenacity

from sluice.errors import ConfigError, StorageError

__all__ = [
    "MISSING",
    "PERMANENT",
    "S3_OPTIONS",
    "error_code",
    "is_transient",
    "list_pages",
    "make_client",
    "parse_s3_uri",
    "s3_call",
]

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
#: error codes that mean "no such object" (GetObject, HeadObject, CopyObject)
MISSING = ("404", "NoSuchKey", "NotFound")

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
#: error codes a retry (or a restart) cannot cure: the StorageError says so (``recoverable=False``)
PERMANENT = ("AccessDenied", "NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled",
             "InvalidBucketName")  # fmt: skip
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
    """A boto3 S3 client from ``options`` (see :data:`S3_OPTIONS`); unset ones come from the AWS chain.

    ``max_attempts`` (default 3) is boto3's own retry budget per request (0: one try), ``connect_timeout``
    and ``read_timeout`` are seconds (boto3's defaults unless given).
    """
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


def error_code(exc: BaseException) -> str:
    """The service's error code of a botocore ``ClientError`` (else its HTTP status), or ``""``."""
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        return str(resp.get("Error", {}).get("Code", "")) or str(
            resp.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
        )
    return ""


def is_transient(exc: BaseException) -> bool:
    """Whether a retry may cure ``exc`` (a botocore error): a connection failure or timeout, a response cut
    short, throttling, a 5xx. A TLS error (a wrong certificate) is not transient."""
    from botocore.exceptions import (
        ClientError,
        ConnectionError,
        HTTPClientError,
        IncompleteReadError,
        SSLError,
    )

    if isinstance(exc, ConnectionError | HTTPClientError | IncompleteReadError):
        return not isinstance(exc, SSLError)
    return isinstance(exc, ClientError) and error_code(exc) in _TRANSIENT


def s3_call(operation: str, bucket: str, fn: Callable[..., T], /, *, attempts: int = 5, **kwargs: Any) -> T:
    """``fn(**kwargs)``, tried up to ``attempts`` times while it fails transiently (exponential backoff);
    other failures, and the last transient one, raise StorageError naming ``operation`` and ``bucket``
    (its ``__cause__`` is the botocore error)."""
    try:
        for attempt in tenacity.Retrying(
            stop=tenacity.stop_after_attempt(attempts),
            wait=tenacity.wait_exponential(multiplier=0.05, max=2.0),
            retry=tenacity.retry_if_exception(is_transient),
            reraise=True,
        ):
            with attempt:
                return fn(**kwargs)
    except Exception as exc:
        from botocore.exceptions import BotoCoreError, ClientError

        if not isinstance(exc, ClientError | BotoCoreError):
            raise
        code = error_code(exc)
        hint = _HINTS.get(code, "")
        raise StorageError(
            f"S3 {operation} on bucket {bucket!r} failed: {code or type(exc).__name__}: {exc}"
            + (f" ({hint})" if hint else ""),
            operation=operation,
            bucket=bucket,
            code=code,
            recoverable=False if code in PERMANENT else None,
        ) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def list_pages(fetch: Callable[..., dict[str, Any]], **kwargs: Any) -> Iterator[dict[str, Any]]:
    """The pages of a paginated listing (``ListObjectsV2``, ``ListMultipartUploads``), following its
    continuation markers; ``fetch(**kw)`` makes one request the caller's way (its bucket, its retries),
    ``kwargs`` are the first request's arguments (``Prefix``, ``Delimiter``)."""
    kw = dict(kwargs)
    while True:
        page = fetch(**kw)
        yield page
        if not page.get("IsTruncated"):
            return
        if "NextContinuationToken" in page:
            kw["ContinuationToken"] = page["NextContinuationToken"]
        else:
            kw["KeyMarker"], kw["UploadIdMarker"] = page["NextKeyMarker"], page["NextUploadIdMarker"]
