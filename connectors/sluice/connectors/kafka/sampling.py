"""Infer a json/csv stream's schema once per source, from a sample across its partitions.

The enumerator reads up to ``schema_sample_size`` records of every partition from its starting offset
(never past its stop offset, and not longer than ``request_timeout_s``), decodes each partition's sample
with the steady decoder, widening across partitions, and hands the result to every reader with its
splits. Sampled records that do not widen are left out of the sample (the readers will meet them again
and treat them as bad records).
"""

from __future__ import annotations

import logging
import time

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from sluice.connectors.kafka.formats import ValueDecoder, make_decoder
from sluice.connectors.kafka.offsets import TopicPartitionKey
from sluice.connectors.kafka.options import KafkaSourceOptions

__all__ = ["sample_schema"]

log = logging.getLogger("sluice.kafka")


def sample_schema(
    options: KafkaSourceOptions, starts: dict[TopicPartitionKey, int], stops: dict[TopicPartitionKey, int]
) -> pa.Schema | None:
    """The schema inferred from a sample of every partition in ``starts`` (None: nothing to sample)."""
    per = options.schema_sample_size
    if not options.infers_schema or per == 0 or not starts:
        return None
    limits = {tp: min(start + per, stops.get(tp, start + per)) for tp, start in starts.items()}
    pending = {tp for tp in starts if starts[tp] < limits[tp]}
    if not pending:
        return None
    values: dict[TopicPartitionKey, list[bytes]] = {tp: [] for tp in pending}
    consumer = Consumer(options.consumer_conf("sluice-schema-sample", bounded=True))
    try:
        consumer.assign([TopicPartition(t, p, starts[(t, p)]) for t, p in sorted(pending)])
        deadline = time.monotonic() + options.request_timeout_s
        while pending and time.monotonic() < deadline:
            for m in consumer.consume(10_000, 0.1):
                tp = (m.topic(), m.partition())
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(tp)
                    continue
                offset, value = m.offset(), m.value()
                if tp not in pending or offset is None:
                    continue
                if offset < limits[tp] and value is not None:
                    values[tp].append(value)
                if offset + 1 >= limits[tp]:
                    pending.discard(tp)
    except KafkaException as exc:
        log.warning("%s: schema sample failed, readers infer from their first batch: %s", options.name, exc)
        return None
    finally:
        consumer.close()
    decoder = make_decoder(options)
    assert isinstance(decoder, ValueDecoder)  # a format that infers its schema decodes values
    for tp in sorted(values):
        if values[tp]:
            decoder.decode(list(values[tp]))
    if decoder.schema is not None:
        log.info(
            "%s: inferred the value schema from %d sampled record(s): %s",
            options.name,
            sum(map(len, values.values())),
            decoder.schema,
        )
    return decoder.schema
