"""``sluice broker``: a throw-away Kafka-protocol broker on this machine, to try the job templates and the
docs' examples on (``pip install 'sluice-etl[demo]'``, which brings tansu).

It listens on ``127.0.0.1:9092`` (``--port``), keeps everything in memory (lost when it stops), creates the
topics it is given and, with ``--sample-events N``, produces N JSON events of the shape the Kafka job
templates read (``id``, ``kind``, ``amount``, ``ts``; a few with a negative amount) into the first of them
(the others start empty: a Kafka sink's output topic). It runs until Ctrl-C
or SIGTERM. It is not a Kafka for production: its deviations from Apache Kafka are in docs/kafka.md.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import click
from sluice.templates.broker import LocalBroker, TansuNotFoundError

__all__ = ["command", "sample_event"]

#: when the sample events' event time starts (epoch milliseconds)
T0 = 1_700_000_000_000


def sample_event(i: int) -> dict[str, Any]:
    """Sample event ``i``: what the Kafka job templates read (``sluice new --list``)."""
    return {"id": i, "kind": ("click", "view", "order")[i % 3], "amount": -1.0 if i % 50 == 7 else float(i % 100),
            "ts": T0 + i * 100}  # fmt: skip


def _topic(spec: str) -> tuple[str, int]:
    name, _, parts = spec.partition(":")
    if not name or (parts and not (parts.isdigit() and int(parts) >= 1)):
        raise click.BadParameter(f"expected NAME or NAME:PARTITIONS (got {spec!r})", param_hint="--topic")
    return name, int(parts or 1)


@click.command("broker")
@click.option("--port", type=click.IntRange(1, 65535), default=9092, show_default=True, help="Port on 127.0.0.1.")
@click.option(
    "--topic",
    "topics",
    multiple=True,
    metavar="NAME[:PARTITIONS]",
    help="Create this topic (repeatable), e.g. --topic events:4.",
)
@click.option("--sample-events", type=click.IntRange(min=0), default=0, show_default=True,
              help="Produce this many sample JSON events (the Kafka templates' shape) into the first --topic; "
                   "the others start empty (e.g. a Kafka sink's output topic).")  # fmt: skip
def command(port: int, topics: tuple[str, ...], sample_events: int) -> None:
    """Run a throw-away Kafka-protocol broker (tansu, in memory) on 127.0.0.1:PORT until Ctrl-C, to try the
    job templates on: KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT sluice run my_job.py. Needs sluice-etl[demo]."""
    wanted = [_topic(t) for t in topics]
    broker = LocalBroker(port=port)
    try:
        broker.start()
    except TansuNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    except RuntimeError as exc:
        raise click.ClickException(f"the broker did not start on 127.0.0.1:{port} (port taken?): {exc}") from None
    stop: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: stop.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        _prepare(broker, wanted, sample_events)
        click.echo(f"broker on {broker.bootstrap} (in memory: its data is gone when it stops)")
        click.echo(f"export KAFKA_BOOTSTRAP_SERVERS={broker.bootstrap}")
        click.echo("Ctrl-C stops it", err=True)
        while not stop:
            if broker._proc is None or broker._proc.poll() is not None:
                raise click.ClickException("the broker exited\n" + broker.log_tail())
            time.sleep(0.2)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        broker.stop()
    click.echo("broker stopped", err=True)


def _prepare(broker: LocalBroker, topics: list[tuple[str, int]], events: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined, unused-ignore]

    for name, partitions in topics:
        broker.admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)
        click.echo(f"topic {name}: {partitions} partition(s)")
    if not events or not topics:
        return
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "log_level": 0})
    for name, partitions in topics[:1]:  # the input; the others are outputs (a Kafka sink's topic)
        for i in range(events):
            producer.produce(name, json.dumps(sample_event(i)).encode(), partition=i % partitions)
            producer.poll(0)
        if producer.flush(60):
            raise click.ClickException(f"producing the sample events into {name} did not finish")
        click.echo(f"topic {name}: {events} sample events")
