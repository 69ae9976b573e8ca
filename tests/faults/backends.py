"""The state backends the fault suite's keyed shapes run on (issue 24), by name."""

from __future__ import annotations

from typing import Any

_ROCKSDB: dict[str, Any] = {"type": "rocksdb", "incremental": True, "memory": "32 mb"}
#: changelog checkpoints with a materialization every 50 ms: the shapes' runs (about a second) restore
#: materializations plus segments, not only segments
_CHANGELOG: dict[str, Any] = {"changelog": True, "changelog_materialize_interval": 0.05}
#: the state backends the keyed shapes run on (``Pipeline(state_backend=...)``): hashmap (the default, full
#: checkpoints) and RocksDB (incremental checkpoints), each with and without changelog checkpoints, and with
#: local recovery (its copies in the scenario's folder: :func:`backend_config`)
BACKENDS: dict[str, dict[str, Any] | None] = {
    "hashmap": None,
    "rocksdb": _ROCKSDB,
    "hashmap+changelog": {"type": "hashmap", **_CHANGELOG},
    "rocksdb+changelog": {**_ROCKSDB, **_CHANGELOG},
    "rocksdb+local": {**_ROCKSDB, "local_recovery": True},
    "rocksdb+changelog+local": {**_ROCKSDB, **_CHANGELOG, "local_recovery": True},
    "hashmap+changelog+local": {"type": "hashmap", **_CHANGELOG, "local_recovery": True},
}


def backend_config(backend: str, d: str) -> dict[str, Any] | None:
    """The state backend options of ``backend`` for a run in folder ``d`` (local copies kept in ``d/local``,
    so restarts within the run find them and they go with the folder)."""
    config = BACKENDS[backend]
    if config is not None and config.get("local_recovery"):
        return {**config, "local_recovery_dir": f"{d}/local"}
    return config
