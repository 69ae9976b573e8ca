"""Versioned serializers: how a connector's checkpoint state becomes bytes (Flink's ``SimpleVersionedSerializer``).

A source names a serializer for its splits and one for its enumerator's state
(:meth:`sluice.source.Source.split_serializer`, :meth:`~sluice.source.Source.enumerator_state_serializer`), a
sink one for its committables and one for its writers' state (:meth:`sluice.sink.Sink.committable_serializer`,
:meth:`~sluice.sink.Sink.writer_state_serializer`). The checkpoint stores each serialized value with the
serializer's :attr:`~SimpleVersionedSerializer.version`, and a restore hands both back, so a connector can
change its format and still read checkpoints of the old one.

The default, :class:`PickleSerializer`, pickles. That is safe only because every checkpoint file is signed
with the job's checkpoint key and verified before anything in it is decoded (docs/security.md); the built-in
connectors use :class:`JsonSerializer`\\ s, so their checkpoints hold no pickle at all. Write your own as a
:class:`JsonSerializer` (:func:`to_json_value` / :func:`from_json_value` carry bytes, tuples, dates,
decimals and Arrow schemas through JSON).

:mod:`~sluice.serializers.versioned` holds the contract and the pickle and JSON serializers,
:mod:`~sluice.serializers.plain` the plain-data encoding they and the checkpoint files use,
:mod:`~sluice.serializers.splits` the serializer of plain source splits.
"""

from sluice.serializers.splits import SourceSplitSerializer
from sluice.serializers.versioned import (
    JsonSerializer,
    PickleSerializer,
    SimpleVersionedSerializer,
    from_json_value,
    schema_from_text,
    schema_to_text,
    to_json_value,
)

__all__ = [
    "JsonSerializer",
    "PickleSerializer",
    "SimpleVersionedSerializer",
    "SourceSplitSerializer",
    "from_json_value",
    "schema_from_text",
    "schema_to_text",
    "to_json_value",
]
