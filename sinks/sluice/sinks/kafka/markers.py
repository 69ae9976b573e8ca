"""The exactly-once Kafka sink's markers, read from the broker: which writer subtasks of a job have
published, up to which checkpoint (the sink's lineage record), and the fencing of their transactional ids
(done before the markers are read, so a transaction of an earlier attempt cannot settle after the read)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sluice.sinks.kafka.options import KafkaSinkOptions

__all__ = ["fence", "marker_groups", "read_markers"]


def _admin(options: KafkaSinkOptions) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(options.client_settings())


def marker_groups(options: KafkaSinkOptions, job_id: str) -> list[str]:
    """The marker groups (= transactional ids) of the sink's writer subtasks in ``job_id`` that the broker
    knows: ``<prefix>-<subtask>``."""
    from sluice.errors import SluiceError

    prefix = options.txn_prefix(job_id) + "-"
    admin = _admin(options)  # held until the result is in: a dropped client cancels its requests
    listed = admin.list_consumer_groups().result(timeout=options.transaction_timeout_s)
    if listed.errors:
        raise SluiceError(
            f"KafkaSink {options.topic}: listing the consumer groups (the sink's markers) failed: {listed.errors[0]}"
        )
    return sorted(
        g.group_id
        for g in listed.valid
        if g.group_id.startswith(prefix) and g.group_id[len(prefix) :].isdigit()
    )


def read_markers(options: KafkaSinkOptions, groups: Sequence[str]) -> dict[str, int]:
    """The checkpoint each marker group last published (groups without a marker are left out).

    Stable offsets only (``require_stable``): an offset a transaction carries counts once that transaction
    is settled, never before. Call it after :func:`fence` of the groups: then no transaction of theirs is
    open, and a commit still in flight is waited for (``UNSTABLE_OFFSET_COMMIT`` is retried until
    ``transaction_timeout_s``).

    Raises:
        SluiceError: a marker cannot be read (the broker's error, or still unstable at the deadline).
    """
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, TopicPartition
    from sluice.errors import SluiceError

    admin = _admin(options)
    out: dict[str, int] = {}
    deadline = time.monotonic() + options.transaction_timeout_s
    for g in groups:  # the admin API takes one group per request
        while True:
            futures = admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(g, [TopicPartition(options.marker, 0)])], require_stable=True
            )
            (tp,) = [
                tp for f in futures.values() for tp in f.result(timeout=options.transaction_timeout_s).topic_partitions
            ]
            if tp.error is None:
                break
            if tp.error.code() != KafkaError.UNSTABLE_OFFSET_COMMIT or time.monotonic() > deadline:
                raise SluiceError(f"KafkaSink {options.topic}: cannot read the marker of group {g!r}: {tp.error}")
            time.sleep(0.05)
        if tp.offset >= 0:
            out[g] = int(tp.offset)
    return out


def fence(options: KafkaSinkOptions, transactional_ids: Sequence[str]) -> None:
    """``init_transactions`` with each id: fences its earlier producers and aborts their open transaction."""
    from confluent_kafka import Producer

    for tid in transactional_ids:
        p = Producer(options.producer_settings(tid))
        p.init_transactions(options.transaction_timeout_s)
