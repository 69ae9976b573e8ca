"""How the Kafka source's splits and enumerator state go into checkpoints: JSON, no pickle.

A split is ``{"id": "<topic>:<partition>", "position": <next offset>, "end": <stop offset or null>,
"value_schema": <Arrow schema as base64 IPC, or null>}``; the enumerator's state is
``{"pending": [split, ...], "discovered": [split id, ...], "schema": <schema or null>}``.
"""

from __future__ import annotations

from typing import Any

from sluice.connectors.kafka.offsets import KafkaSplit
from sluice.serializers import JsonSerializer, schema_from_text, schema_to_text
from sluice.source import SourceSplit

__all__ = ["KafkaEnumeratorStateSerializer", "KafkaSplitSerializer"]


def _offset(value: Any, what: str, optional: bool) -> int | None:
    if value is None and optional:
        return None
    if type(value) is not int:
        raise TypeError(f"a Kafka split's {what} must be an integer offset, not {type(value).__name__}")
    return value


class KafkaSplitSerializer(JsonSerializer[SourceSplit]):
    """A Kafka split (topic partition, next offset, stop offset, inferred value schema) as JSON."""

    def to_json(self, obj: SourceSplit) -> Any:
        return {
            "id": obj.split_id,
            "position": _offset(obj.position, "position", optional=True),
            "end": _offset(obj.end, "end", optional=True),
            "value_schema": schema_to_text(getattr(obj, "value_schema", None)),
        }

    def from_json(self, version: int, value: Any) -> SourceSplit:
        sid = value["id"]
        if not isinstance(sid, str):
            raise TypeError("a Kafka split id must be a string")
        return KafkaSplit(
            sid,
            _offset(value["position"], "position", optional=True),
            _offset(value["end"], "end", optional=True),
            value_schema=schema_from_text(value["value_schema"]),
        )


class KafkaEnumeratorStateSerializer(JsonSerializer[dict[str, Any]]):
    """The Kafka enumerator's state: splits not yet assigned, partitions discovered, the inferred schema."""

    _splits = KafkaSplitSerializer()

    def to_json(self, obj: dict[str, Any]) -> Any:
        return {
            "pending": [self._splits.to_json(s) for s in obj["pending"]],
            "discovered": sorted(str(s) for s in obj["discovered"]),
            "schema": schema_to_text(obj.get("schema")),
        }

    def from_json(self, version: int, value: Any) -> dict[str, Any]:
        return {
            "pending": [self._splits.from_json(version, s) for s in value["pending"]],
            "discovered": [str(s) for s in value["discovered"]],
            "schema": schema_from_text(value["schema"]),
        }
