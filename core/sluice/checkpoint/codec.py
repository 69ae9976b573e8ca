"""What a checkpoint's ``_metadata`` holds of connectors, and how it is signed.

``_metadata`` is JSON. The enumerators' states and the global committables are stored as *envelopes*
``{"v": <serializer version>, "data": <bytes>}`` written by the connector's versioned serializer
(:mod:`sluice.serializers`), in the plain encoding of :mod:`sluice.serializers.plain`; the task state files
store source splits and sink committables the same way. The coordinator seals the metadata last:
``format``, ``key_id`` and ``mac``, an HMAC-SHA256 with the job's checkpoint key over the canonical JSON of
everything else. A restore verifies it before it reads anything else of the checkpoint
(:func:`verify_metadata`).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.checkpoint.global_commit import CommitGroups
from sluice.checkpoint.payload import mac_failure, without_channel_state
from sluice.checkpoint.signing import key_id, mac
from sluice.checkpoint.storage import CheckpointStorage
from sluice.errors import RestoreError
from sluice.graph import JobGraph, NodeKind
from sluice.serializers import PickleSerializer, SimpleVersionedSerializer, plain

__all__ = [
    "METADATA_FORMAT",
    "MetadataCodec",
    "envelope",
    "from_metadata",
    "open_envelope",
    "read_commit_groups",
    "seal_metadata",
    "verify_metadata",
    "write_commit_groups",
]

METADATA_FORMAT = 1
_CONTEXT = b"sluice checkpoint metadata"
_PICKLE = PickleSerializer()


def envelope(serializer: SimpleVersionedSerializer[Any], obj: Any) -> dict[str, Any]:
    """``obj`` serialized, with the serializer's version: ``{"v": version, "data": bytes}``."""
    return {"v": int(serializer.version), "data": serializer.serialize(obj)}


def open_envelope(serializer: SimpleVersionedSerializer[Any], env: Any, what: str) -> Any:
    """The value an :func:`envelope` holds; RestoreError naming ``what`` if it cannot be read."""
    if not isinstance(env, dict) or set(env) != {"v", "data"} or type(env["v"]) is not int:
        raise RestoreError(f"{what}: not a serialized value (expected {{'v': version, 'data': bytes}})")
    if not isinstance(env["data"], bytes):
        raise RestoreError(f"{what}: its data is not bytes")
    try:
        return serializer.deserialize(env["v"], env["data"])
    except Exception as exc:
        raise RestoreError(
            f"{what}: {type(serializer).__name__} cannot read it (format version {env['v']}): "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def seal_metadata(metadata: dict[str, Any], key: bytes) -> dict[str, Any]:
    """``metadata`` as it is stored (JSON-normalized), with ``format``, ``key_id`` and its ``mac``."""
    body: dict[str, Any] = json.loads(json.dumps(metadata))
    body.pop("mac", None)
    body["format"] = METADATA_FORMAT
    body["key_id"] = key_id(key)
    body["mac"] = mac(key, _CONTEXT, _canonical(body)).hex()
    return body


def verify_metadata(metadata: dict[str, Any], key: bytes, name: str) -> None:
    """Refuse (RestoreError naming ``name``, one line) metadata the job's key did not seal."""
    if not isinstance(metadata, dict):
        raise RestoreError(f"{name} is not a sluice checkpoint metadata file (not a JSON object)")
    tag = metadata.get("mac")
    if not isinstance(tag, str):
        raise RestoreError(
            f"{name} is not signed: it was written before sluice authenticated its checkpoints (pickle "
            "format), which restore refuses since anyone who can write the storage could have planted it; "
            "nothing in it was loaded. Start the job without it (--restore none)"
        )
    if metadata.get("format") != METADATA_FORMAT:
        raise RestoreError(
            f"{name} has checkpoint format {metadata.get('format')!r}; this sluice reads {METADATA_FORMAT}"
        )
    body = {k: v for k, v in metadata.items() if k != "mac"}
    if not hmac.compare_digest(tag, mac(key, _CONTEXT, _canonical(body)).hex()):
        claimed = metadata.get("key_id")
        ok = isinstance(claimed, str) and len(claimed) == 12 and all(c in "0123456789abcdef" for c in claimed)
        raise RestoreError(mac_failure(name, key, claimed if ok else None))


def read_commit_groups(groups: Any, serializer: SimpleVersionedSerializer[Any], what: str) -> CommitGroups:
    """``[[checkpoint id, [envelope, ...]], ...]`` (decoded from plain data) as commit groups."""
    if not isinstance(groups, list):
        raise RestoreError(f"{what}: expected a list of [checkpoint id, committables]")
    out: CommitGroups = []
    for group in groups:
        if not (isinstance(group, list | tuple) and len(group) == 2 and type(group[0]) is int):
            raise RestoreError(f"{what}: expected [checkpoint id, committables], got {type(group).__name__}")
        if not isinstance(group[1], list):
            raise RestoreError(f"{what}: the committables of checkpoint {group[0]} are not a list")
        out.append((group[0], [open_envelope(serializer, env, what) for env in group[1]]))
    return out


def write_commit_groups(groups: CommitGroups, serializer: SimpleVersionedSerializer[Any]) -> list[Any]:
    """Inverse of :func:`read_commit_groups` (before the plain encoding)."""
    return [[cid, [envelope(serializer, c) for c in comms]] for cid, comms in groups]


def from_metadata(tree: Any, what: str) -> Any:
    """A plain-encoded entry of ``_metadata``, decoded (RestoreError naming ``what`` if malformed)."""
    try:
        return plain.decode(tree)
    except plain.PlainFormatError as exc:
        raise RestoreError(f"{what}: malformed: {exc}") from None


@dataclass(frozen=True)
class MetadataCodec:
    """The coordinator's side: serializes enumerator states and global committables, seals the metadata.

    Attributes:
        key: The job's checkpoint key.
        enumerators: Each source's enumerator-state serializer, by operator uid (default: pickle).
        committables: Each sink's committable serializer, by operator uid (default: pickle).
    """

    key: bytes = field(repr=False)
    enumerators: Mapping[str, SimpleVersionedSerializer[Any]] = field(default_factory=dict)
    committables: Mapping[str, SimpleVersionedSerializer[Any]] = field(default_factory=dict)

    @classmethod
    def for_job(cls, job: JobGraph, key: bytes) -> MetadataCodec:
        """The codec of ``job``: its sources' enumerator-state and its sinks' committable serializers."""
        nodes = job.logical.nodes.values()
        return cls(
            key,
            enumerators={n.uid: n.spec.enumerator_state_serializer() for n in nodes if n.kind is NodeKind.SOURCE},
            committables={n.uid: n.spec.committable_serializer() for n in nodes if n.kind is NodeKind.SINK},
        )

    def enumerator_state(self, uid: str, state: Any) -> Any:
        """The metadata entry of source ``uid``'s enumerator snapshot."""
        return plain.encode(envelope(self.enumerators.get(uid, _PICKLE), state))

    def global_committables(self, groups: Mapping[str, CommitGroups]) -> Any:
        """The metadata entry of every sink's uncommitted global committables, by checkpoint."""
        return {
            uid: plain.encode(write_commit_groups(g, self.committables.get(uid, _PICKLE)))
            for uid, g in groups.items()
        }

    def seal(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """``metadata`` signed with the key (:func:`seal_metadata`)."""
        return seal_metadata(metadata, self.key)

    def without_channel_state(
        self, storage: CheckpointStorage, path: str, keyed: Callable[[Any], Any] | None = None
    ) -> bytes:
        """A finished task's state file at ``path`` (verified) without its in-flight data (its keyed state
        handles passed through ``keyed``), signed again."""
        return without_channel_state(storage.read_file(path), self.key, path, keyed)


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
