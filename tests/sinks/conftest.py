"""Helpers of the file sink tests: moto's S3 server handle (the ``moto_s3`` fixture is in tests/conftest.py),
read-back helpers and a SinkContext for driving writers directly."""

from __future__ import annotations

import re
import socket
import uuid
from dataclasses import dataclass
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from tests import listing

FINAL = re.compile(r"^part-.+-\d{6}-\d{3}-(c?\d+)-[0-9a-f]{12}\.(parquet|jsonl|csv)(\.gz)?$")
CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


@dataclass
class MotoS3:
    endpoint: str
    port: int

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.endpoint, **CREDS)

    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, **CREDS}

    def new_bucket(self) -> str:
        name = f"sluice-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def arrow_fs(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
            access_key="testing",
            secret_key="testing",
            region="us-east-1",
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_visible(root: str, fmt: str = "parquet", filesystem: Any = None) -> pa.Table:
    """What a reader sees: pyarrow.dataset with Hive partitioning, hidden files ignored (its default)."""
    dataset = ds.dataset(root, format=fmt, partitioning="hive", filesystem=filesystem)
    for f in dataset.files:
        assert FINAL.match(f.rsplit("/", 1)[-1]), f"a reader sees a non-final file: {f}"
    return dataset.to_table()


def local_files(root: str) -> list[str]:
    """Every file under ``root``, relative to it (tests/listing.py: safe while a job writes there)."""
    return list(listing.files(root))


def s3_keys(s3: MotoS3, bucket: str, prefix: str = "") -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def same_rows(got: pa.Table, expected: pa.Table) -> None:
    """``got`` holds exactly the rows of ``expected`` (by id; no loss, no duplicates)."""
    got = got.select(expected.schema.names).cast(expected.schema).sort_by("id")
    expected = expected.sort_by("id")
    ids = got.column("id").to_pylist()
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicated rows"
    assert got.num_rows == expected.num_rows, f"{got.num_rows} rows visible, expected {expected.num_rows}"
    assert got.equals(expected)


class Ctx:
    """A SinkContext for driving writers and committers directly."""

    def __init__(
        self,
        job_id: str = "job",
        subtask: int = 0,
        attempt: int = 0,
        fault_at: str | None = None,
        fault_after: int = 0,
    ) -> None:
        self.job_id, self.subtask, self.parallelism, self.attempt = job_id, subtask, 1, attempt
        self.metrics: dict[str, int] = {}
        self._fault_at, self._after = fault_at, fault_after

    def metric(self, name: str, increment: int = 1) -> None:
        self.metrics[name] = self.metrics.get(name, 0) + increment

    def gauge(self, name: str, value: float) -> None:
        self.metrics[name] = int(value)

    def fault_hook(self, point: str) -> None:
        if point == self._fault_at:
            if self._after == 0:
                self._fault_at = None
                raise RuntimeError(f"crash at {point}")
            self._after -= 1


def compact(sink: Any, checkpoint_id: int, committables: list[Any], ctx: Ctx | None = None) -> list[Any]:
    """What the compactor stage does with one checkpoint's committables: merge them key by key."""
    k = sink.create_compactor(ctx or Ctx())
    assert k is not None
    by_key: dict[str, list[Any]] = {}
    for c in committables:
        by_key.setdefault(k.key(c), []).append(c)
    return [c for group in by_key.values() for c in k.compact(checkpoint_id, group)]
