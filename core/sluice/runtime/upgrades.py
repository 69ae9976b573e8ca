"""What may change between a checkpoint (or savepoint) and the job that restores it (docs/upgrades.md).

An operator's state is readable only as it was written: a window's state holds the windows of its size, a
deduplication's the horizons of its ``within``, every keyed state the key groups of its key columns. The API
records, for each stateful operator, the settings its state depends on (``LogicalNode.state_config``: the
operator, its window, horizon, bounds or key columns, and the key columns' types where the stream's schema is
known); every checkpoint's metadata carries them (``operators``, by uid). A restore compares them with the
job's and refuses a change in one line naming the operator and what changed, unless the restore allows it
(``allow_changed_operators``: the old state is then read with the new settings).

A checkpoint written before this record existed holds no settings: nothing is compared, except an interval
join's, refused because its ``between`` changed meaning (Flink's since). A checkpoint whose keyed state was
written before timestamp and date keys hashed as they do now (``key_hash``, :data:`KEY_HASH`) is refused
where its key types were among those whose key groups changed.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.errors import RestoreError
from sluice.graph import JobGraph, LogicalNode
from sluice.keys import KeySelector

__all__ = ["KEY_HASH", "check_operator_changes", "key_config", "operator_configs"]

#: how a setting is named in messages; ``_ms`` settings are shown in milliseconds
_LABELS = {
    "operator": "operator",
    "window": "window kind",
    "size_ms": "window size",
    "slide_ms": "window slide",
    "offset_ms": "window offset",
    "gap_ms": "session gap",
    "allowed_lateness_ms": "allowed_lateness",
    "time": "time",
    "aggregations": "aggregations",
    "within_ms": "within",
    "keep": "keep",
    "order_by": "order_by",
    "right_key": "right key columns",
    "lower_ms": "between lower",
    "upper_ms": "between upper",
    "key": "key columns",
    "key_types": "key column types",
    "mode": "mode",
    "key_columns": "key_columns",
}
_HOW = (
    "give the operator a new uid to start it empty (and allow_non_restored_state to drop the old state), "
    "restore with allow_changed_operators=True (sluice run --allow-changed-operators) to read the old state "
    "with the new settings, or restore='none' (docs/upgrades.md)"
)


#: how keys hash to key groups (sluice.state.keygroups), recorded with key types whose hashing changed: 2
#: since timestamps hash as microseconds whatever their unit and dates as days, with or without nulls in
#: their batch (before, a timestamp[ms] key hashed by its milliseconds, and a date key failed the job)
KEY_HASH = 2


def _rehashed(types: list[str]) -> bool:
    """Whether key columns of ``types`` fell in other key groups before :data:`KEY_HASH` 2 (timestamps of a
    unit other than microseconds, dates)."""
    return any(t.startswith(("timestamp[s", "timestamp[ms", "timestamp[ns", "date")) for t in types)


def key_config(key: KeySelector | None, schema: Any = None) -> dict[str, Any]:
    """The key part of an operator's settings: its key columns (or the key function's name) and, where the
    stream's schema is known, their types (a type change moves every key to another key group), with
    :data:`KEY_HASH` where the types are among those whose key groups changed."""
    if key is None:
        return {}
    if key._columns is None:
        return {"key": f"function {key.description}"}
    out: dict[str, Any] = {"key": list(key._columns)}
    if schema is not None and all(schema.get_field_index(c) >= 0 for c in key._columns):
        out["key_types"] = [str(schema.field(c).type) for c in key._columns]
        if _rehashed(out["key_types"]):
            out["key_hash"] = KEY_HASH
    return out


def _config(node: LogicalNode) -> dict[str, Any] | None:
    config = node.state_config
    if config is None and node.spec is not None and hasattr(node.spec, "restore_config"):
        config = node.spec.restore_config()  # a sink's
    if config is None:
        return None
    plain: dict[str, Any] = json.loads(json.dumps(config))  # as the metadata holds it (tuples as lists)
    return plain


def operator_configs(job: JobGraph) -> dict[str, dict[str, Any]]:
    """uid -> the settings its state depends on, for every operator of ``job`` that declares them."""
    out = {}
    for node in job.logical.nodes.values():
        config = _config(node)
        if config is not None:
            out[node.uid] = config
    return out


def _show(field: str, value: Any) -> str:
    if value is None:
        return "none"
    if field.endswith("_ms") and isinstance(value, int):
        return f"{value} ms"
    return json.dumps(value) if not isinstance(value, str) else value


def _changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    if old.get("operator") != new.get("operator"):
        return [f"operator {_show('operator', old.get('operator'))} -> {_show('operator', new.get('operator'))}"]
    out = []
    for field in [*old, *(f for f in new if f not in old)]:
        if field in ("key_types", "key_hash") and (field not in old or field not in new):
            continue  # a schema the job did not know when one of them was built (key_hash: _check_key_hash)
        if old.get(field) != new.get(field):
            label = _LABELS.get(field, field)
            out.append(f"{label} {_show(field, old.get(field))} -> {_show(field, new.get(field))}")
    return out


def check_operator_changes(path: str, metadata: dict[str, Any], job: JobGraph, holding: set[str], allow: bool) -> None:
    """Refuse (RestoreError, one line) a restore of checkpoint ``path`` whose operators that hold state
    (``holding``: uids) were written with other settings than ``job``'s, unless ``allow``."""
    if allow:
        return
    recorded = metadata.get("operators")
    for node in job.logical.nodes.values():
        new = _config(node)
        if new is None or node.uid not in holding:
            continue
        if recorded is None:
            if new.get("operator") == "interval_join":
                raise RestoreError(
                    f"checkpoint {path}: interval_join {node.name!r} (uid {node.uid!r}) was written by an earlier "
                    "sluice, whose between=(lower, upper) paired other.t - lower <= self.t <= other.t + upper; "
                    "between now has Flink's meaning (self.t + lower <= other.t <= self.t + upper: the old (a, b) "
                    "is (-b, a) now). Check the bounds, then restore with allow_changed_operators=True (sluice "
                    "run --allow-changed-operators)"
                )
            continue  # an earlier sluice recorded no settings: nothing to compare
        old = recorded.get(node.uid)
        if old is None:
            continue
        _check_key_hash(path, node, old)
        changes = _changes(old, new)
        if changes:
            raise RestoreError(
                f"checkpoint {path}: operator {node.name!r} (uid {node.uid!r}) changed since the checkpoint: "
                f"{'; '.join(changes)}. Its state was written with the old settings: {_HOW}"
            )


def _check_key_hash(path: str, node: LogicalNode, old: dict[str, Any]) -> None:
    """Refuse keyed state written before :data:`KEY_HASH` 2 by key types whose key groups changed."""
    types = old.get("key_types") or []
    if "key_hash" in old or not _rehashed(types):
        return
    raise RestoreError(
        f"checkpoint {path}: operator {node.name!r} (uid {node.uid!r}) is keyed by {json.dumps(types)} and was "
        "written by an earlier sluice, in whose key groups a timestamp key depended on its column's unit and on "
        "nulls in its batch (a date key failed the job); restore with allow_changed_operators=True (sluice run "
        "--allow-changed-operators) to read its state as it is (a key held in another key group is not found: "
        "a duplicate may pass once, a window may be split), or restore='none' (docs/upgrades.md)"
    )
