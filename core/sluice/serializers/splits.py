"""The serializer of plain :class:`~sluice.source.SourceSplit` objects (the generator source's)."""

from __future__ import annotations

from typing import Any

from sluice.serializers.versioned import JsonSerializer, from_json_value, to_json_value

__all__ = ["SourceSplitSerializer"]


class SourceSplitSerializer(JsonSerializer[Any]):
    """Plain :class:`~sluice.source.SourceSplit` objects whose ``position`` and ``end`` are plain data
    (numbers, strings, lists, dicts, ...: see :func:`to_json_value`). Used by the generator source."""

    def to_json(self, obj: Any) -> Any:
        from sluice.source import SourceSplit

        if type(obj) is not SourceSplit:
            raise TypeError(f"SourceSplitSerializer writes SourceSplit, not {type(obj).__name__}")
        return {"id": obj.split_id, "position": to_json_value(obj.position), "end": to_json_value(obj.end)}

    def from_json(self, version: int, value: Any) -> Any:
        from sluice.source import SourceSplit

        return SourceSplit(str(value["id"]), from_json_value(value["position"]), from_json_value(value["end"]))
