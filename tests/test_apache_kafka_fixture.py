"""The Apache Kafka fixture itself (tests/apache_kafka.py): it starts, serves, keeps transactions' semantics
(which tansu does not: an aborted transaction's records must stay invisible to ``read_committed``), compacts
and survives a crash. Every check reads back through a plain consumer, never through the fixture's own view.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.apache_kafka import (
    COMPACTED_TOPIC,
    ApacheKafkaBroker,
    ApacheKafkaUnavailableError,
    find_java,
    kafka_classpath,
)
from tests.faults.proxy import FaultProxy
from tests.kafka_test_broker import read_committed

pytestmark = pytest.mark.apache_kafka  # the tests without the session's broker start brokers of their own

Topic = Callable[..., str]


def _transactional(bootstrap: str, txn_id: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5, "log_level": 0})
    p.init_transactions(30)
    return p


def _txn(p: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    p.begin_transaction()
    for i, v in enumerate(values):
        p.produce(topic, v, partition=i % 2)
    p.flush(30)  # librdkafka can fail an abort racing its own first AddPartitionsToTxn (librdkafka #4849)
    (p.commit_transaction if commit else p.abort_transaction)(30)


def _wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def _read_uncommitted(bootstrap: str, topic: str, partitions: int) -> list[bytes | None]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "uncommitted", "isolation.level": "read_uncommitted",
                  "enable.partition.eof": True, "fetch.wait.max.ms": 10, "log_level": 0})  # fmt: skip
    todo, out = set(range(partitions)), []
    try:
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + 60
        while todo and time.monotonic() < deadline:
            for m in c.consume(1000, 0.2):
                if m.error() is None:
                    out.append(m.value())
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    todo.discard(m.partition())
        assert not todo, f"partitions {todo} not read to their end"
    finally:
        c.close()
    return out


def test_topics_produce_read_and_native_add_partitions(apache_kafka: ApacheKafkaBroker, kafka_topic: Topic) -> None:
    topic = kafka_topic(partitions=2)
    apache_kafka.produce(topic, [b"a", b"b", b"c"], partition=0)
    apache_kafka.produce(topic, [b"d", b"d"], partition=1)  # a record sent twice is read twice
    assert apache_kafka.end_offsets(topic) == {0: 3, 1: 2}
    apache_kafka.add_partitions(topic, 4)
    apache_kafka.produce(topic, [b"e"], partition=3)
    records = apache_kafka.read_committed(topic)
    assert [(r.partition, r.offset, r.value) for r in records] == [
        (0, 0, b"a"), (0, 1, b"b"), (0, 2, b"c"), (1, 0, b"d"), (1, 1, b"d"), (3, 0, b"e"),
    ]  # fmt: skip
    assert apache_kafka.end_offsets(topic) == {0: 3, 1: 2, 2: 0, 3: 1}


def test_read_committed_sees_committed_transactions_only(apache_kafka: ApacheKafkaBroker, kafka_topic: Topic) -> None:
    topic = kafka_topic(partitions=2)
    p = _transactional(apache_kafka.bootstrap, f"{topic}-txn")
    _txn(p, topic, [b"c1-%d" % i for i in range(100)], commit=True)
    _txn(p, topic, [b"aborted-%d" % i for i in range(100)], commit=False)
    _txn(p, topic, [b"c2-%d" % i for i in range(100)], commit=True)
    seen = sorted(r.value or b"" for r in apache_kafka.read_committed(topic))
    assert seen == sorted([b"c1-%d" % i for i in range(100)] + [b"c2-%d" % i for i in range(100)])
    # the aborted records are in the log (a read_uncommitted consumer gets them): the broker hid them
    assert sum(1 for v in _read_uncommitted(apache_kafka.bootstrap, topic, 2) if v and v.startswith(b"aborted")) == 100
    # an open transaction ends the read at the last stable offset, without waiting for it
    p.begin_transaction()
    p.produce(topic, b"open", partition=0)
    p.flush(30)
    assert sorted(r.value or b"" for r in apache_kafka.read_committed(topic, timeout=30)) == seen
    p.abort_transaction(30)


def test_log_cleaner_compacts_and_drops_tombstones(apache_kafka: ApacheKafkaBroker, kafka_topic: Topic) -> None:
    topic = kafka_topic(partitions=1, config=dict(COMPACTED_TOPIC))
    keys = [b"k%d" % i for i in range(10)]
    apache_kafka.produce(topic, [b"old"] * 10, keys=keys, partition=0)
    apache_kafka.produce(topic, [b"new"] * 10, keys=keys, partition=0)
    apache_kafka.produce(topic, [None] * 5, keys=keys[:5], partition=0)  # tombstones
    want = {k: b"new" for k in keys[5:]}
    deadline, got = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        # the active segment is never cleaned: each append past segment.ms rolls the one before it
        apache_kafka.produce(topic, [b"roll"], keys=[b"roll"], partition=0)
        records = [r for r in apache_kafka.read_committed(topic) if r.key != b"roll"]
        got = [(r.key, r.value) for r in records]
        if len(got) == len(want) and dict(got) == want:
            break
        time.sleep(0.2)
    assert got is not None and dict(got) == want and len(got) == len(want), got
    assert apache_kafka.cleaned_offsets(topic).get(0, 0) >= 25


def test_behind_a_fault_proxy_restart_and_crash_keep_the_data() -> None:
    """A broker of its own (not to restart the session's), behind a fault proxy: clients given the proxy reach
    the broker only through it (it advertises the proxy), the internal listener, which no proxy fronts, serves
    the test's own reads during an outage; a clean restart and a crash keep ports and data."""
    proxy = FaultProxy().start()
    broker = ApacheKafkaBroker()
    broker.advertised_port = proxy.port
    try:
        broker.start()
        proxy.set_upstream("127.0.0.1", int(broker.bootstrap.rsplit(":", 1)[1]))
        broker.create_topic("t", 2)
        p = _transactional(proxy.address, "t-txn")
        _txn(p, "t", [b"kept-%d" % i for i in range(50)], commit=True)
        _txn(p, "t", [b"aborted-%d" % i for i in range(50)], commit=False)
        del p
        assert proxy.stats.accepted > 0 and proxy.stats.bytes_up > 0
        proxy.reject()  # an outage as clients see it; the broker keeps running
        kept = sorted(b"kept-%d" % i for i in range(50))
        assert sorted(r.value or b"" for r in read_committed(broker.internal_bootstrap, "t")) == kept
        # an abort returns before its markers are written; a broker killed before them restarts with the
        # transaction hanging (see ApacheKafkaBroker.kill), so the crash comes once they are in the log
        _wait_for(lambda: broker.stable_offsets("t") == broker.end_offsets("t") == {0: 52, 1: 52})
        ports = (broker.bootstrap, broker.internal_bootstrap)
        broker.restart()  # a clean shutdown
        assert sorted(r.value or b"" for r in read_committed(broker.internal_bootstrap, "t")) == kept
        proxy.restore()
        broker.produce("t", [b"after-restart"], partition=0)
        broker.kill()  # a crash
        assert not broker.running
        broker.start()
        assert (broker.bootstrap, broker.internal_bootstrap) == ports
        got = sorted(r.value or b"" for r in read_committed(proxy.address, "t"))
        assert got == sorted([*kept, b"after-restart"])
        assert broker.end_offsets("t") == {0: 53, 1: 52}  # 2 x (25 records + a marker) per partition, + 1
    finally:
        proxy.cut()
        broker.stop()
        proxy.stop()


def test_missing_jars_or_java_fail_with_how_to_get_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    classpath = kafka_classpath()  # resolved if this machine's cache is not yet complete
    with pytest.raises(ApacheKafkaUnavailableError, match=r"not in .*: run \.ci/run"):
        kafka_classpath(resolve=False, cache=tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn
    with pytest.raises(ApacheKafkaUnavailableError, match=r"Maven \(mvn\) is not installed: run \.ci/run"):
        kafka_classpath(cache=tmp_path)
    assert kafka_classpath() == classpath  # a complete cache needs no Maven
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nojava"))
    with pytest.raises(ApacheKafkaUnavailableError, match=r"needs Java 17\+, none found: run \.ci/run"):
        find_java()


def test_a_jvm_that_exits_at_startup_fails_with_its_log() -> None:
    broker = ApacheKafkaBroker(jvm_options=("-XX:+NoSuchOptionForSluice",))
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 1 during startup.*NoSuchOptionForSluice"):
        broker.start()
    assert not broker.running
