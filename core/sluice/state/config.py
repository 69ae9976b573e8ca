"""How a job keeps its keyed state: the state backend's options and state time-to-live.

:class:`StateBackendConfig` is set in code (``StateBackendConfig(type="rocksdb", incremental=True)``) or
with Flink's keys (:data:`STATE_KEYS`, read by :meth:`StateBackendConfig.from_settings`)::

    state.backend.type: rocksdb
    state.backend.incremental: true
    state.backend.rocksdb.localdir: /mnt/ssd/sluice
    state.backend.rocksdb.memory.fixed-per-slot: 512 mb

Both are validated when they are made; a wrong value is one :class:`~sluice.errors.ConfigError` line naming
the option and what is allowed. :class:`StateTtlConfig` is Flink's ``StateTtlConfig``, set per state
descriptor.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import field_validator, model_validator

from sluice.config import _Frozen
from sluice.durations import to_seconds
from sluice.errors import ConfigError

__all__ = [
    "STATE_KEYS",
    "StateBackendConfig",
    "StateTtlConfig",
    "parse_memory_size",
]

_MEMORY_UNITS = {
    "": 1, "b": 1, "bytes": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "kibibytes": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20, "mebibytes": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "gibibytes": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40, "tebibytes": 1 << 40,
}  # fmt: skip
_MEMORY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)
#: the smallest memory budget the RocksDB backend accepts (block cache plus write buffers)
MIN_MEMORY = 16 << 20


def parse_memory_size(option: str, value: Any) -> int:
    """Bytes in ``value``: an int, or a number with Flink's units (``64 mb``, ``1gb``; binary, a bare
    number is bytes)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _MEMORY.fullmatch(str(value))
    if m is None or m.group(2).lower() not in _MEMORY_UNITS:
        raise ConfigError(f"{option}: {value!r} is not a memory size: write e.g. '512 mb' or '1 gb'")
    return int(float(m.group(1)) * _MEMORY_UNITS[m.group(2).lower()])


def _seconds(option: str, value: Any) -> float:
    """A duration option of code (a bare number is seconds; :mod:`sluice.durations`)."""
    return to_seconds(value, option, sign="any")


def _setting_seconds(key: str, value: Any) -> float:
    """A duration from Flink's keys (a unit is required)."""
    return to_seconds(value, key, sign="any", bare="refuse")


class StateBackendConfig(_Frozen):
    """Where keyed state lives and how it is checkpointed.

    Attributes:
        type: ``"hashmap"`` (Python objects in memory, full snapshots) or ``"rocksdb"`` (an embedded RocksDB
            per operator subtask on local disk: state larger than memory; needs ``sluice-etl[rocksdb]``).
        incremental: RocksDB checkpoints upload only the files the last completed checkpoint has not
            (``state.backend.incremental``); False uploads every file each time.
        changelog: changelog (generalized incremental) checkpoints (``state.backend.changelog.enabled``):
            each checkpoint persists the changes since the last one, a full materialization is written in
            the background.
        changelog_materialize_interval: time between background materializations (a duration) with changelog on
            (``state.backend.changelog.periodic-materialize.interval``).
        local_recovery: keep a local copy of the last completed checkpoint for restarts on the same host
            (``state.backend.local-recovery``).
        local_dir: where RocksDB and changelog segments keep their files (``state.backend.rocksdb.localdir``);
            None: the system's temporary folder.
        local_recovery_dir: where local recovery keeps its copies (``taskmanager.state.local.root-dirs``);
            None: ``local_dir``.
        memory: bytes (or ``"512 mb"``) RocksDB may use per operator subtask's process share: the block
            cache, with the write buffers charged to it (``state.backend.rocksdb.memory.fixed-per-slot``).
        write_buffer_ratio: the part of RocksDB's share of ``memory`` write buffers may take
            (``state.backend.rocksdb.memory.write-buffer-ratio``).
        write_cache_ratio: the part of ``memory`` for the RocksDB backend's write-back cache of entries
            (hot keys read and written as Python bytes, written to RocksDB at checkpoints and when the cache
            is full; ``state.backend.rocksdb.memory.write-cache-ratio``); 0 turns it off.
        compaction_style: RocksDB's compaction, ``"level"`` or ``"universal"``
            (``state.backend.rocksdb.compaction.style``; docs/state.md, *RocksDB options*).
        bloom_bits_per_key: bits per key of RocksDB's Bloom filters
            (``state.backend.rocksdb.bloom-filter.bits-per-key``); more bits, fewer reads of absent keys.
        partitioned_index_filters: RocksDB's index and filters in 4 KiB partitions, the top level pinned
            (``state.backend.rocksdb.memory.partitioned-index-filters``; Flink's default is off, sluice's on): a
            point read loads one partition, not a file's whole filter; for state larger than the block cache
            (docs/state.md, *RocksDB options*).
    """

    type: Literal["hashmap", "rocksdb"] = "hashmap"
    incremental: bool = False
    changelog: bool = False
    changelog_materialize_interval: float = 600.0
    local_recovery: bool = False
    local_dir: str | None = None
    local_recovery_dir: str | None = None
    memory: int = 256 << 20
    write_buffer_ratio: float = 0.5
    write_cache_ratio: float = 0.25
    compaction_style: Literal["level", "universal"] = "level"
    bloom_bits_per_key: float = 16.0
    partitioned_index_filters: bool = True

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> int:
        return parse_memory_size("memory", value)

    @field_validator("changelog_materialize_interval", mode="before")
    @classmethod
    def _interval(cls, value: Any) -> float:
        return _seconds("StateBackendConfig(changelog_materialize_interval)", value)

    @model_validator(mode="after")
    def _check(self) -> StateBackendConfig:
        def bad(option: str, allowed: str, got: Any) -> ConfigError:
            return ConfigError(f"invalid StateBackendConfig: {option} must be {allowed} (got {got!r})")

        if self.memory < MIN_MEMORY:
            raise bad("memory", f"at least {MIN_MEMORY >> 20} mb", self.memory)
        if not 0 < self.write_buffer_ratio < 1:
            raise bad("write_buffer_ratio", "a number between 0 and 1 (exclusive)", self.write_buffer_ratio)
        if not 0 <= self.write_cache_ratio < 1:
            raise bad("write_cache_ratio", "a number from 0 (no cache) to below 1", self.write_cache_ratio)
        if not 1 <= self.bloom_bits_per_key <= 64:
            raise bad("bloom_bits_per_key", "a number from 1 to 64", self.bloom_bits_per_key)
        if not self.changelog_materialize_interval > 0:
            raise bad("changelog_materialize_interval", "a duration > 0", self.changelog_materialize_interval)
        for option in ("local_dir", "local_recovery_dir"):
            folder = getattr(self, option)
            if folder is not None and not folder.strip():
                raise bad(option, "a folder path, or None for the default", folder)
        if self.type == "rocksdb" and importlib.util.find_spec("rocksdict") is None:
            raise ConfigError(
                "state.backend.type rocksdb needs the rocksdb extra: pip install 'sluice-etl[rocksdb]'"
            )
        return self

    @classmethod
    def from_settings(
        cls, settings: Mapping[str, Any], base: StateBackendConfig | None = None
    ) -> StateBackendConfig:
        """``base`` (default: the defaults) changed by the ``state.backend.*`` keys in ``settings``.

        Keys that are not state backend keys are ignored (the caller validates them).
        """
        fields = base.model_dump() if base is not None else {}
        for key, value in settings.items():
            spec = STATE_KEYS.get(key)
            if spec is not None:
                field, parse = spec
                fields[field] = parse(key, value)
        return cls(**fields)


def _bool(key: str, value: Any) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(f"{key}: {value!r} is not a boolean (true or false)")
    return text == "true"


def _backend_type(key: str, value: Any) -> str:
    text = str(value).strip().lower()
    aliases = {"hashmap": "hashmap", "heap": "hashmap", "rocksdb": "rocksdb", "filesystem": "hashmap"}
    if text not in aliases:
        raise ConfigError(f"{key}: {value!r} is not allowed (allowed: hashmap, rocksdb)")
    return aliases[text]


def _text(key: str, value: Any) -> str:
    if not str(value).strip():
        raise ConfigError(f"{key}: must not be empty")
    return str(value).strip()


def _compaction_style(key: str, value: Any) -> str:
    text = str(value).strip().lower()
    if text not in ("level", "universal"):
        raise ConfigError(f"{key}: {value!r} is not allowed (allowed: level, universal)")
    return text


def _float(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: {value!r} is not a number") from None


#: Flink's state backend keys sluice reads, and the :class:`StateBackendConfig` field each sets
STATE_KEYS: dict[str, tuple[str, Any]] = {
    "state.backend.type": ("type", _backend_type),
    "state.backend": ("type", _backend_type),
    "state.backend.incremental": ("incremental", _bool),
    "execution.checkpointing.incremental": ("incremental", _bool),
    "state.backend.changelog.enabled": ("changelog", _bool),
    "state.backend.changelog.periodic-materialize.interval": ("changelog_materialize_interval", _setting_seconds),
    "state.backend.local-recovery": ("local_recovery", _bool),
    "execution.state-recovery.from-local": ("local_recovery", _bool),
    "state.backend.rocksdb.localdir": ("local_dir", _text),
    "taskmanager.state.local.root-dirs": ("local_recovery_dir", _text),
    "state.backend.rocksdb.memory.fixed-per-slot": ("memory", parse_memory_size),
    "state.backend.rocksdb.memory.write-buffer-ratio": ("write_buffer_ratio", _float),
    "state.backend.rocksdb.memory.write-cache-ratio": ("write_cache_ratio", _float),
    "state.backend.rocksdb.compaction.style": ("compaction_style", _compaction_style),
    "state.backend.rocksdb.bloom-filter.bits-per-key": ("bloom_bits_per_key", _float),
    "state.backend.rocksdb.memory.partitioned-index-filters": ("partitioned_index_filters", _bool),
}


class StateTtlConfig(_Frozen):
    """Time to live of a state's values (Flink's ``StateTtlConfig``), set on its descriptor.

    Times are processing time. A value's clock restarts when it is created or written
    (``update_type="on_create_and_write"``), or also when it is read (``"on_read_and_write"``). Expired
    values are never returned (``visibility="never_return_expired"``) unless
    ``"return_expired_if_not_cleaned_up"`` is chosen. Expired values are removed when they are read, by a
    background scan of ``cleanup_size`` entries per state access (``cleanup_in_background``), when a
    checkpoint is restored, and from full snapshots and savepoints if ``cleanup_full_snapshot``. List state
    expires per element, map state per entry.

    Attributes:
        ttl: how long a value lives (a duration > 0: "10 min", a timedelta, seconds).
        update_type: when its clock restarts.
        visibility: whether an expired value not yet removed may be returned.
        cleanup_full_snapshot: leave expired values out of full snapshots and savepoints.
        cleanup_in_background: scan for expired values while the state is used.
        cleanup_size: entries the background scan checks per state access.
    """

    ttl: float
    update_type: Literal["on_create_and_write", "on_read_and_write"] = "on_create_and_write"
    visibility: Literal["never_return_expired", "return_expired_if_not_cleaned_up"] = "never_return_expired"
    cleanup_full_snapshot: bool = False
    cleanup_in_background: bool = True
    cleanup_size: int = 5

    @field_validator("ttl", mode="before")
    @classmethod
    def _ttl(cls, value: Any) -> float:
        return _seconds("StateTtlConfig(ttl)", value)

    @model_validator(mode="after")
    def _check(self) -> StateTtlConfig:
        if not 0 < self.ttl < float("inf"):
            raise ConfigError(f"invalid StateTtlConfig: ttl must be a finite duration > 0 (got {self.ttl!r})")
        if self.cleanup_size < 1:
            raise ConfigError(f"invalid StateTtlConfig: cleanup_size must be >= 1 (got {self.cleanup_size})")
        return self

    @property
    def ttl_ms(self) -> int:
        """The time to live in milliseconds."""
        return max(1, round(self.ttl * 1000))
