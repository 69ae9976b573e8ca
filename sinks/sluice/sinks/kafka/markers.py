"""The exactly-once Kafka sink's markers, read from the broker: which writer subtasks of a job have
published, up to which checkpoint (the sink's lineage record), and the fencing of their transactional ids."""

from __future__ import annotations

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
    """The checkpoint each marker group last published (groups without a marker are left out). Read before
    any writer of the job runs; a transaction a crashed attempt left open is not waited for (its marker is
    not committed, and the restore aborts it)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    admin = _admin(options)
    out: dict[str, int] = {}
    for g in groups:  # the admin API takes one group per request
        futures = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(g, [TopicPartition(options.marker, 0)])], require_stable=False
        )
        for f in futures.values():
            for tp in f.result(timeout=options.transaction_timeout_s).topic_partitions:
                if tp.error is None and tp.offset >= 0:
                    out[g] = int(tp.offset)
    return out


def fence(options: KafkaSinkOptions, transactional_ids: Sequence[str]) -> None:
    """``init_transactions`` with each id: fences its earlier producers and aborts their open transaction."""
    from confluent_kafka import Producer

    for tid in transactional_ids:
        p = Producer(options.producer_settings(tid))
        p.init_transactions(options.transaction_timeout_s)
