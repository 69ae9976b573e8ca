"""Errors of the Kafka source. Both derive from :class:`sluice.errors.SluiceError`::

SluiceError
└── KafkaSourceError       broker unreachable, topic missing, offsets cannot be resolved
    └── KafkaDataLossError a checkpointed offset no longer exists (retention, re-created topic)
"""

from __future__ import annotations

from sluice.errors import SluiceError

__all__ = ["KafkaDataLossError", "KafkaSourceError"]


class KafkaSourceError(SluiceError):
    """The Kafka source cannot do its work (unreachable brokers, missing topic, failed offset lookup)."""


class KafkaDataLossError(KafkaSourceError):
    """The position to resume from is out of range: the records there were deleted.

    Attributes:
        topic: the topic.
        partition: the partition.
        offset: the offset the source tried to read.
    """

    def __init__(self, source: str, topic: str, partition: int, offset: int) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        super().__init__(
            f"KafkaSource {source!r}: offset {offset} of topic {topic!r} partition {partition} is out of "
            "range (deleted by retention, or the topic was re-created): the records after the checkpoint "
            "are gone. "
            "Restore an older checkpoint, or set fail_on_data_loss=False to continue from the earliest "
            "available offset (losing the missing records)."
        )
