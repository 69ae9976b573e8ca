"""How the file sink's committables and writer state go into checkpoints: JSON, no pickle.

A committable is the JSON object of :class:`~sluice.sinks.files.committable.FileCommittable`'s fields
(``parts`` as ``[[number, etag], ...]``); the writer's state is ``{"held": [committable, ...],
"held_age": {bucket: checkpoints}}`` (the small files held back for compaction).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from sluice.serializers import JsonSerializer
from sluice.sinks.files.committable import FileCommittable

__all__ = ["FileCommittableSerializer", "FileWriterStateSerializer"]

_FIELDS = tuple(f.name for f in fields(FileCommittable))


class FileCommittableSerializer(JsonSerializer[FileCommittable]):
    """A :class:`FileCommittable` as a JSON object of its fields."""

    def to_json(self, obj: FileCommittable) -> Any:
        out = {name: getattr(obj, name) for name in _FIELDS}
        out["parts"] = [[int(n), str(etag)] for n, etag in obj.parts]
        out["replaces"] = list(obj.replaces)
        return out

    def from_json(self, version: int, value: Any) -> FileCommittable:
        unknown = set(value) - set(_FIELDS)
        if unknown:
            raise ValueError(f"unknown file committable fields {sorted(unknown)}")
        args = dict(value)
        args["parts"] = tuple((int(n), str(etag)) for n, etag in value.get("parts", []))
        args["replaces"] = tuple(str(r) for r in value.get("replaces", []))
        return FileCommittable(**args)


class FileWriterStateSerializer(JsonSerializer[dict[str, Any]]):
    """The file sink writer's state: held files and their age by bucket."""

    _committable = FileCommittableSerializer()

    def to_json(self, obj: dict[str, Any]) -> Any:
        return {
            "held": [self._committable.to_json(c) for c in obj.get("held", [])],
            "held_age": {str(b): int(age) for b, age in obj.get("held_age", {}).items()},
        }

    def from_json(self, version: int, value: Any) -> dict[str, Any]:
        return {
            "held": [self._committable.from_json(version, c) for c in value["held"]],
            "held_age": {str(b): int(age) for b, age in value["held_age"].items()},
        }
