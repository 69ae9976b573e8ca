"""Errors of the Kafka source. Both derive from :class:`sluice.errors.SluiceError`::

SluiceError
└── KafkaSourceError          broker unreachable, topic missing, offsets cannot be resolved
    ├── KafkaDataLossError    a checkpointed offset no longer exists (retention, re-created topic)
    ├── SchemaRegistryError   the schema registry is unreachable, refuses the credentials or answers nonsense
    │   └── SchemaNotFoundError  the registry has no schema with a record's id (the record is a bad record)
    ├── UnsupportedSchemaError   a schema has no Arrow counterpart (e.g. an Avro union of int and string)
    └── IncompatibleSchemaError  a record's type cannot be widened into the stream's schema

The last three describe one record's problem: the reader turns them into a BadRecordError naming the topic,
partition and offset (``on_bad_record="fail"``) or a dead letter carrying the message.
"""

from __future__ import annotations

from sluice.errors import SluiceError

__all__ = [
    "IncompatibleSchemaError",
    "KafkaDataLossError",
    "KafkaSourceError",
    "SchemaNotFoundError",
    "SchemaRegistryError",
    "UnsupportedSchemaError",
]


class KafkaSourceError(SluiceError):
    """The Kafka source cannot do its work (unreachable brokers, missing topic, failed offset lookup).

    A missing topic, and brokers never reached since the job started, are not ``recoverable``: the job
    fails at once. Brokers that answered before and stopped answering are an outage: restarts apply.
    """


class KafkaDataLossError(KafkaSourceError):
    """The position to resume from is out of range: the records there were deleted. Not recoverable: a
    restart resumes at the same position.

    Attributes:
        topic: the topic.
        partition: the partition.
        offset: the offset the source tried to read.
    """

    recoverable = False

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


class SchemaRegistryError(KafkaSourceError):
    """The schema registry cannot be used: unreachable after retries, credentials refused, or a malformed
    answer. The job fails (and restarts by its restart strategy); records are not dead-lettered for it."""


class SchemaNotFoundError(SchemaRegistryError):
    """The registry answered that it has no schema with this id (HTTP 404, error code 40403).

    The reader turns this into a bad record (``on_bad_record``), never a silent drop.

    Attributes:
        schema_id: the id that is not registered.
    """

    def __init__(self, url: str, schema_id: int) -> None:
        self.schema_id = schema_id
        super().__init__(
            f"unknown schema id {schema_id}: the schema registry at {url!r} has no schema with this id "
            "(the record was written with another registry, or its schema was deleted)"
        )


class UnsupportedSchemaError(KafkaSourceError, ValueError):
    """A schema (Avro, JSON Schema) uses a construct that has no Arrow column type; the message says which."""


class IncompatibleSchemaError(KafkaSourceError, ValueError):
    """A value's type cannot be widened into the type its field already has.

    Widening allows int -> double (and smaller -> larger ints and floats), null -> any type, timestamp ->
    string, new fields in objects, and the same inside lists and nested objects.

    Attributes:
        field: the dotted path of the field (``a.b``; ``a[]`` for list items).
        old: the type the stream has.
        new: the type of the value.
    """

    def __init__(self, field: str, old: object, new: object) -> None:
        self.field = field
        self.old = old
        self.new = new
        super().__init__(
            f"field {field!r} changed type from {old} to {new}, which does not widen (only int -> double, "
            "null -> any type and new fields do): give an explicit schema, or fix the producer"
        )
