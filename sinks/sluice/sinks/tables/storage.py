"""Where a table lives: its URI, its storage options in each library's spelling, a pyarrow file system.

``storage_options`` takes sluice's spelling, the one :class:`~sluice.CheckpointConfig` uses (``endpoint_url``,
``region_name``, ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``), and passes any
other key through unchanged, so a library's own options (delta-rs ``AWS_...`` keys, pyiceberg ``s3.*``
properties) work as well.
"""

from __future__ import annotations

import os
import uuid
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs
from sluice.errors import ConfigError

__all__ = [
    "SLUICE_S3_OPTIONS",
    "arrow_filesystem",
    "delta_options",
    "iceberg_io_options",
    "probe_location",
    "split_uri",
]

#: sluice's spelling of S3 connection options (the keys CheckpointConfig.storage_options takes)
SLUICE_S3_OPTIONS = (
    "endpoint_url",
    "region_name",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
)

_DELTA = {
    "endpoint_url": "AWS_ENDPOINT_URL",
    "region_name": "AWS_REGION",
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "aws_session_token": "AWS_SESSION_TOKEN",
}
_ICEBERG = {
    "endpoint_url": "s3.endpoint",
    "region_name": "s3.region",
    "aws_access_key_id": "s3.access-key-id",
    "aws_secret_access_key": "s3.secret-access-key",
    "aws_session_token": "s3.session-token",
}


def split_uri(uri: str) -> tuple[str, str]:
    """``(scheme, path)``: ``("file", "/abs/dir")`` for local folders and ``file://``, ``("s3", "bucket/key")``."""
    if uri.startswith("s3://") or uri.startswith("s3a://"):
        parsed = urlparse(uri)
        if not parsed.netloc:
            raise ConfigError(f"table path {uri!r} names no bucket (expected s3://bucket/prefix)")
        return "s3", f"{parsed.netloc}/{parsed.path.lstrip('/')}".rstrip("/")
    if uri.startswith("file://"):
        return "file", os.path.abspath(urlparse(uri).path)
    if "://" in uri:
        raise ConfigError(f"table path must be a local folder, file:// or s3://bucket/prefix (got {uri!r})")
    return "file", os.path.abspath(uri)


def delta_options(uri: str, options: dict[str, Any]) -> dict[str, str]:
    """delta-rs storage options. On S3 commits use conditional put (``If-None-Match: *``), set explicitly.

    delta-rs 1.x has no locking provider and no unsafe-rename mode any more: a commit is a put of the next
    ``_delta_log`` entry that fails if another writer created it first. The store must honour conditional
    writes (AWS S3 since 2024, MinIO, moto); ``conditional_put`` is set so a library default cannot undo it.
    """
    out = {_DELTA.get(k, k): str(v) for k, v in options.items()}
    if split_uri(uri)[0] == "s3":
        if out.get("conditional_put", "etag") != "etag" or out.get("aws_conditional_put", "etag") != "etag":
            raise ConfigError(
                "DeltaSink: storage_options conditional_put must be 'etag' on S3 (delta-rs commits with "
                "conditional puts; without them concurrent commits could overwrite each other)"
            )
        out.setdefault("conditional_put", "etag")
        if out.get("AWS_ENDPOINT_URL", "").startswith("http://"):
            out.setdefault("AWS_ALLOW_HTTP", "true")
    return out


def iceberg_io_options(options: dict[str, Any]) -> dict[str, str]:
    """pyiceberg FileIO properties."""
    return {_ICEBERG.get(k, k): str(v) for k, v in options.items()}


def arrow_filesystem(uri: str, options: dict[str, Any]) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system for the table at ``uri`` and the table's root path in it."""
    scheme, path = split_uri(uri)
    if scheme == "file":
        return pafs.LocalFileSystem(), path
    o = {_DELTA.get(k, k).upper(): str(v) for k, v in options.items()}
    o.update({k.upper().replace("S3.", "S3_"): str(v) for k, v in options.items() if k.startswith("s3.")})
    endpoint = o.get("AWS_ENDPOINT_URL") or o.get("S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
    kw: dict[str, Any] = {
        "access_key": o.get("AWS_ACCESS_KEY_ID") or o.get("S3_ACCESS-KEY-ID"),
        "secret_key": o.get("AWS_SECRET_ACCESS_KEY") or o.get("S3_SECRET-ACCESS-KEY"),
        "session_token": o.get("AWS_SESSION_TOKEN") or o.get("S3_SESSION-TOKEN"),
        "region": o.get("AWS_REGION")
        or o.get("S3_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or "us-east-1",
    }
    if endpoint:
        parsed = urlparse(endpoint)
        kw["endpoint_override"] = parsed.netloc or endpoint
        kw["scheme"] = parsed.scheme or "https"
    return pafs.S3FileSystem(**{k: v for k, v in kw.items() if v is not None}), path


def probe_location(uri: str, options: dict[str, Any]) -> None:
    """Write and delete a small file under ``uri`` (the folder created if missing): raises what the file
    system says if it cannot (at job start: is a table's location writable?)."""
    fs, root = arrow_filesystem(uri, options)
    fs.create_dir(root, recursive=True)
    path = f"{root}/_sluice_probe-{uuid.uuid4().hex}"
    with fs.open_output_stream(path) as out:
        out.write(b"sluice")
    fs.delete_file(path)
