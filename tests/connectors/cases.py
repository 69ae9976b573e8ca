"""The built-in connectors as conformance-kit cases, one pytest fixture each.

To put another sink under the kit (a table sink, say), write a fixture here returning a
:class:`~sluice.testing.conformance.SinkCase`, add its name to :data:`SINK_CASES` and import it in
tests/connectors/conftest.py.
"""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from sluice.connectors.generator import GeneratorSource
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.testing.conformance import SinkCase, SinkTarget, SourceCase

from tests import listing
from tests.apache_kafka import ApacheKafkaBroker
from tests.postgres_server import PostgresServer
from tests.sinks.conftest import MotoS3
from tests.sinks.tables.helpers import Target

#: source cases (fixture names) every source check runs against
SOURCE_CASES = ["generator_source", "kafka_source", "kafka_source_native"]
#: the cases on the session's Apache Kafka: their tests are marked ``apache_kafka`` (the fixture is asked for
#: through the case, which the marking in tests/conftest.py cannot see)
APACHE_KAFKA_CASES = {"kafka_source", "kafka_source_native", "kafka_sink"}
#: sink cases (fixture names) every sink check runs against; add a sink here
SINK_CASES = [
    "file_sink_local", "file_sink_compacting", "file_sink_s3", "test_sink", "test_sink_global", "delta_table",
    "iceberg_table", "kafka_sink", "postgres_append", "postgres_upsert",
]

_names = itertools.count()


# -- sources --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def generator_source() -> SourceCase:
    src = GeneratorSource(num_splits=5, records_per_split=120, batch_size=25)
    return SourceCase(src, src.expected(), columns=["id"])


@pytest.fixture(scope="module")
def kafka_source(apache_kafka: ApacheKafkaBroker) -> SourceCase:
    """JSON records in 3 partitions of a topic on Apache Kafka; the source stops 7 records before each
    partition's end (the broker's high watermark), so a reader that reads past its stop offset emits
    records no bounded run may emit. Today's reader (confluent-kafka)."""
    return _kafka_case(apache_kafka, "python")


@pytest.fixture(scope="module")
def kafka_source_native(apache_kafka: ApacheKafkaBroker) -> SourceCase:
    """:func:`kafka_source` on the native reader (fetch and JSON decoding without the GIL)."""
    return _kafka_case(apache_kafka, "native")


def _kafka_case(broker: ApacheKafkaBroker, reader: str) -> SourceCase:
    topic = f"conformance-{next(_names)}-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, 3)
    for p in range(3):
        broker.produce(topic, [json.dumps({"id": p * 1000 + i}).encode() for i in range(90)], partition=p)
    ends = broker.end_offsets(topic)
    assert ends == {0: 90, 1: 90, 2: 90}
    stops = {(topic, p): end - 7 for p, end in ends.items()}
    src = KafkaSource(
        broker.bootstrap,
        topic,
        format="json",
        schema=pa.schema([("id", pa.int64())]),
        batch_size=20,
        stopping_offsets=stops,
        reader=reader,
    )
    src.validate()
    expected = pa.table({"id": [p * 1000 + i for p in range(3) for i in range(stops[(topic, p)])]})
    return SourceCase(src, expected, columns=["id"])


# -- sinks ----------------------------------------------------------------------------------------------
def _hidden_files(root: str) -> list[str]:
    return [rel for rel in listing.files(root) if rel.rsplit("/", 1)[-1].startswith((".", "_"))]


def _local_files(base: Path, **options: Any) -> Callable[[], SinkTarget]:
    def target() -> SinkTarget:
        root = base / f"files-{next(_names)}"
        root.mkdir()
        return SinkTarget(
            FileSink(str(root), format="parquet", **options),
            lambda: ds.dataset(str(root), format="parquet", partitioning="hive").to_table(),
            lambda: _hidden_files(str(root)),
        )

    return target


@pytest.fixture
def file_sink_local(tmp_path: Path) -> SinkCase:
    return SinkCase(_local_files(tmp_path), columns=["id", "key", "value"])


@pytest.fixture
def file_sink_compacting(tmp_path: Path) -> SinkCase:
    """Bucketed by key, small files held back across two checkpoints and merged."""
    return SinkCase(
        _local_files(tmp_path, bucket_by=["key"], compaction={"max_checkpoints": 2}), columns=["id", "value"]
    )


@pytest.fixture
def file_sink_s3(moto_s3: MotoS3, tmp_path: Path) -> SinkCase:
    fs = moto_s3.arrow_fs()
    client = moto_s3.client()

    def target() -> SinkTarget:
        bucket = moto_s3.new_bucket()

        def staged() -> list[str]:
            keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
            uploads = [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
            return sorted(
                [k for k in keys if k.rsplit("/", 1)[-1].startswith(".")] + [f"upload:{k}" for k in uploads]
            )

        def visible() -> pa.Table | None:
            if not client.list_objects_v2(Bucket=bucket, Prefix="out/").get("Contents"):
                return None
            return ds.dataset(f"{bucket}/out", format="parquet", filesystem=fs).to_table()

        sink = FileSink(
            f"s3://{bucket}/out",
            format="parquet",
            storage_options=moto_s3.options(),
            multipart_threshold=1,  # every file a multipart upload, completed at commit
            local_tmp_dir=str(tmp_path),
        )
        return SinkTarget(sink, visible, staged)

    return SinkCase(target, columns=["id", "key", "value"])


def _test_sink(base: Path, global_commit: bool) -> Callable[[], SinkTarget]:
    def target() -> SinkTarget:
        d = str(base / f"test-sink-{next(_names)}")
        return SinkTarget(
            TwoPhaseCommitTestSink(d, global_commit=global_commit),
            lambda: read_committed(d),
            lambda: sorted(os.listdir(os.path.join(d, "pending"))),
        )

    return target


@pytest.fixture
def test_sink(tmp_path: Path) -> SinkCase:
    return SinkCase(_test_sink(tmp_path, False))


@pytest.fixture
def test_sink_global(tmp_path: Path) -> SinkCase:
    return SinkCase(_test_sink(tmp_path, True))


def _table(kind: str, base: Path) -> Callable[[], SinkTarget]:
    def target() -> SinkTarget:
        folder = base / f"{kind}-{next(_names)}"
        folder.mkdir()
        t = Target(kind, str(folder / "lake"), {}, str(folder))

        def staged() -> list[str]:
            """Parquet files in the table's location that its current version does not reference."""
            referenced = {f.removeprefix("file://") for f in t.files()} if t.exists() else set()
            paths = (os.path.join(t.root, rel) for rel in listing.files(t.root))
            return sorted(p for p in paths if p.endswith(".parquet") and p not in referenced)

        return SinkTarget(t.sink(), lambda: t.read() if t.exists() else None, staged, t.versions)

    return target


@pytest.fixture
def delta_table(tmp_path: Path) -> SinkCase:
    return SinkCase(_table("delta", tmp_path), columns=["id", "key", "value"])


@pytest.fixture
def iceberg_table(tmp_path: Path) -> SinkCase:
    return SinkCase(_table("iceberg", tmp_path), columns=["id", "key", "value"])


@pytest.fixture
def kafka_sink(apache_kafka: ApacheKafkaBroker) -> SinkCase:
    """Exactly-once into a 3-partition topic on Apache Kafka, read back by a plain ``read_committed`` consumer
    (the kit's crash in the middle of a commit leaves an aborted transaction, which the broker hides from it;
    nothing is deduplicated). Staged records live in the checkpoint: nothing is staged on the broker between
    transactions."""
    from sluice.sinks.kafka import KafkaSink

    def target() -> SinkTarget:
        t = f"kafka-sink-{next(_names)}-{uuid.uuid4().hex[:6]}"
        apache_kafka.create_topic(t, 3)

        def visible() -> pa.Table | None:
            rows = [json.loads(r.value) for r in apache_kafka.read_committed(t) if r.value is not None]
            return pa.Table.from_pylist(rows) if rows else None

        return SinkTarget(KafkaSink(apache_kafka.bootstrap, t, key_columns="key"), visible, lambda: [])

    return SinkCase(target, columns=["id", "key", "value"])


def _postgres(pg: PostgresServer, mode: str) -> Callable[[], SinkTarget]:
    from sluice.sinks.postgres import PostgresSink

    conninfo = pg.new_database()

    def target() -> SinkTarget:
        table = f"events_{next(_names)}"
        keys = {"key_columns": ["id"]} if mode == "upsert" else {}
        sink = PostgresSink(conninfo, table, mode=mode, **keys)

        def visible() -> pa.Table | None:
            rows = pg.query(f"SELECT id, key, value FROM {table} WHERE to_regclass('{table}') IS NOT NULL", conninfo=conninfo) \
                if pg.query("SELECT to_regclass(%s)", table, conninfo=conninfo)[0][0] else []
            return pa.Table.from_pylist([{"id": r[0], "key": r[1], "value": r[2]} for r in rows]) if rows else None

        def staged() -> list[str]:  # prepared transactions of this sink, on the server
            return [r[0] for r in pg.query("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                                           f"sluice:%:{table}:%", conninfo=conninfo)]  # fmt: skip

        return SinkTarget(sink, visible, staged)

    return target


@pytest.fixture
def postgres_append(postgres: PostgresServer) -> SinkCase:
    return SinkCase(_postgres(postgres, "append"), columns=["id", "key", "value"])


@pytest.fixture
def postgres_upsert(postgres: PostgresServer) -> SinkCase:
    return SinkCase(_postgres(postgres, "upsert"), columns=["id", "key", "value"])
