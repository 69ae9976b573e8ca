"""The whole job SIGKILLed inside the publish of a large Kafka transaction, on Apache Kafka.

A Kafka -> Kafka job (``sluice run job.py``, KafkaSink exactly once, parallelism 1) runs as a subprocess. Its
checkpoint interval is longer than the run, so its only checkpoint with data is the final one: the writer
publishes one transaction of 30,000 records, and every restore of that checkpoint publishes it again unless
its marker says it was published. The test watches the output topic and kills the process a few milliseconds after records appear in
it (the first kill at once, later ones after a random delay and with the sink's default producer settings
or the slow ones), restarts the job (``--restore latest``, the default) and does so again; the last run goes
to the end.

A kill counts only if it landed inside a publish: right after it, the topic's last stable offset is below its
end (a transaction open or committing), and that transaction's (transactional id, checkpoint), read from the
records between the two offsets, turns out to hold at least 10,000 records. The sink's lineage header serves
only this placement check; the judge is a plain ``read_committed`` consumer compared with the input as a
multiset: every input record exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.apache_kafka import ApacheKafkaBroker
from tests.faults.shapes import record

pytestmark = pytest.mark.faults

HEADER = "sluice-lineage"
#: a kill counts only inside the publish of a transaction of at least this many records
LARGE = 10_000
PER_PARTITION = 15_000
#: producer settings that stretch a publish over hundreds of small produce requests, one at a time (a run
#: with them is certain to be inside its publish when its first records appear); the sink's defaults send a
#: publish in a few large requests, and a kill lands in its produce loop, flush, commit or after it
SLOW = {"batch.num.messages": 50, "linger.ms": 0, "max.in.flight.requests.per.connection": 1}

JOB = textwrap.dedent(
    '''
    """Kafka -> Kafka exactly once, configured from the environment (tests/faults/test_kafka_sink_kills.py)."""
    import json
    import os

    import pyarrow as pa
    from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
    from sluice.connectors.kafka import KafkaSource
    from sluice.sinks.kafka import KafkaSink

    env = os.environ
    stops = {(t, int(p)): o for t, p, o in json.loads(env["JOB_STOPS"])}
    pipeline = Pipeline(
        "kafka-sink-kills",
        parallelism=1,
        checkpoint=CheckpointConfig(interval=3600.0, storage=env["JOB_CHECKPOINTS"]),
        restart=FixedDelayRestart(attempts=2, delay=0.0),
    )
    source = KafkaSource(env["JOB_BOOTSTRAP"], env["JOB_TOPIC"], format="json", schema=pa.schema([("id", pa.int64())]),
                         batch_size=1000, stopping_offsets=stops)
    pipeline.source(source).sink(KafkaSink(env["JOB_BOOTSTRAP"], env["JOB_OUT"], lineage_header=env["JOB_HEADER"],
                                           producer_config=json.loads(env["JOB_PRODUCER"])))
    '''
)


def _tags_between(broker: ApacheKafkaBroker, topic: str, start: dict[int, int], end: dict[int, int]) -> set[str]:
    """The ``<transactional id>:<checkpoint>`` of the records between ``start`` and ``end`` (read_uncommitted)."""
    todo = {p: (s, end[p]) for p, s in start.items() if s < end[p]}
    c = Consumer({"bootstrap.servers": broker.internal_bootstrap, "group.id": "sluice-tests-kill-placement",
                  "enable.auto.commit": False, "isolation.level": "read_uncommitted", "log_level": 0})  # fmt: skip
    tags: set[str] = set()
    try:
        c.assign([TopicPartition(topic, p, s) for p, (s, _) in todo.items()])
        deadline = time.monotonic() + 60
        while todo and time.monotonic() < deadline:
            for m in c.consume(1000, 0.2):
                if m.error() is not None:
                    continue
                part, offset = m.partition(), m.offset()
                assert part is not None and offset is not None
                tag = dict(m.headers() or ()).get(HEADER)
                if tag is not None:
                    tags.add(tag.decode().rsplit(":", 1)[0])
                if part in todo and offset + 1 >= todo[part][1]:
                    del todo[part]
    finally:
        c.close()
    return tags


class _Watch:
    """The sum of ``topic``'s end offsets, asked with one long-lived consumer (a check is one request per
    partition, so records are seen within milliseconds of their arrival)."""

    def __init__(self, broker: ApacheKafkaBroker, topic: str) -> None:
        self.parts = [TopicPartition(topic, p) for p in broker.end_offsets(topic)]
        self.consumer = Consumer({"bootstrap.servers": broker.internal_bootstrap, "group.id": "sluice-tests-kill-watch",
                                  "isolation.level": "read_uncommitted", "log_level": 0})  # the end, not the LSO

    def end(self) -> int:
        return sum(self.consumer.get_watermark_offsets(tp, timeout=30, cached=False)[1] for tp in self.parts)

    def close(self) -> None:
        self.consumer.close()


def _killed_inside_a_publish(
    broker: ApacheKafkaBroker, out: str, watch: _Watch, proc: subprocess.Popen[bytes], delay: float
) -> set[str]:
    """Run until records appear in ``out`` (beyond transaction markers), wait ``delay``, SIGKILL the job; the
    tags of the transaction it was publishing then (empty: it was not inside a publish, or it had exited)."""
    base = watch.end()
    while proc.poll() is None and watch.end() <= base + len(watch.parts):  # a commit or an abort adds a marker
        time.sleep(0.001)  # per partition
    time.sleep(delay)
    if proc.poll() is not None:
        return set()
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    end, stable = broker.end_offsets(out), broker.stable_offsets(out)
    return _tags_between(broker, out, stable, end) if stable != end else set()


def kill_scenario(broker: ApacheKafkaBroker, tmp: Path, seed: int, kills: int, delays: tuple[float, ...], enough: int) -> None:
    """Up to ``kills`` kills, then a run to the end. Until a kill landed inside a publish, runs publish
    slowly (:data:`SLOW`) and are killed as soon as records appear, so one lands inside however loaded the
    machine; later runs draw their producer settings and a delay from ``delays``. The kills stop once
    ``enough`` landed inside a large publish, or a run finished on its own (all is published then)."""
    rng = random.Random(seed)
    src, out = f"kills-src-{seed}-{tmp.name}", f"kills-out-{seed}-{tmp.name}"
    broker.create_topic(src, 2)
    broker.create_topic(out, 3)
    for p in (0, 1):
        broker.produce(src, [json.dumps({"id": p * 10**6 + i}).encode() for i in range(PER_PARTITION)], partition=p)
    expected = Counter(p * 10**6 + i for p in (0, 1) for i in range(PER_PARTITION))
    (tmp / "job.py").write_text(JOB)
    env = {**os.environ, "JOB_BOOTSTRAP": broker.bootstrap, "JOB_TOPIC": src, "JOB_OUT": out, "JOB_HEADER": HEADER,
           "JOB_STOPS": json.dumps([(src, p, o) for p, o in broker.end_offsets(src).items()]),
           "JOB_CHECKPOINTS": str(tmp / "chk")}  # fmt: skip
    cmd = [sys.executable, "-m", "sluice.cli", "run", str(tmp / "job.py"), "--runtime", "local"]
    inside: list[set[str]] = []
    watch = _Watch(broker, out)
    try:
        for _ in range(kills):
            producer = rng.choice([SLOW, {}]) if inside else SLOW
            proc = subprocess.Popen(cmd, env={**env, "JOB_PRODUCER": json.dumps(producer)}, cwd=tmp,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
            try:
                tags = _killed_inside_a_publish(broker, out, watch, proc, rng.choice(delays) if inside else 0.0)
            finally:
                if proc.poll() is None:
                    proc.kill()
                output = proc.communicate(timeout=60)[0].decode(errors="replace")
            assert proc.returncode in (0, -signal.SIGKILL), output[-3000:]
            if tags:
                inside.append(tags)
            if len(inside) >= enough or proc.returncode == 0:
                break
    finally:
        watch.close()
    last = subprocess.run(cmd, env={**env, "JOB_PRODUCER": "{}"}, cwd=tmp, capture_output=True, text=True, timeout=600)
    assert last.returncode == 0 and "finished" in last.stdout, last.stdout[-3000:] + last.stderr[-3000:]
    committed = broker.read_committed(out)
    got = Counter(json.loads(r.value)["id"] for r in committed if r.value is not None)
    sizes = Counter((r.header(HEADER) or b"").decode().rsplit(":", 1)[0] for r in committed)
    fired = sum(1 for tags in inside if any(sizes[t] >= LARGE for t in tags))
    record("kafka-sink-kill", seed, "kafka->kafka", "aligned", fired > 0, fired, list(got.elements()),
           list(expected.elements()))  # fmt: skip
    assert fired > 0, f"no kill landed inside the publish of a transaction of >= {LARGE} records ({inside}, {sizes})"
    lost, dup = sum((expected - got).values()), sum((got - expected).values())
    assert not lost and not dup, f"{fired} kill(s) inside large publishes: {lost} lost, {dup} duplicated"


def test_sigkill_inside_a_large_publish(apache_kafka: ApacheKafkaBroker, tmp_path: Path) -> None:
    """The default run: kills at once when records appear, until one landed inside a large publish."""
    kill_scenario(apache_kafka, tmp_path, seed=1, kills=5, delays=(), enough=1)


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(100, 130))
def test_soak_sigkill_inside_large_publishes(apache_kafka: ApacheKafkaBroker, tmp_path: Path, seed: int) -> None:
    """Up to six kills each, the later ones a few milliseconds to a few hundred after records appear (inside
    the produce loop, the flush, the commit, or after it)."""
    kill_scenario(apache_kafka, tmp_path, seed, kills=6, delays=(0.0, 0.002, 0.01, 0.05, 0.15, 0.3), enough=4)
