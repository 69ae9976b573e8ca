"""StateBackendConfig: Flink's keys and the Python API alike, validated when made, errors in one line."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from sluice.errors import ConfigError
from sluice.state.config import STATE_KEYS, StateBackendConfig, parse_memory_size
from sluice.state.factory import LayeredStateBackend, create_state_backend
from sluice.state.hashmap import HashMapStateBackend
from sluice.state.rocksdb import RocksDBStateBackend


def test_flink_keys_set_the_same_options_as_the_python_api(tmp_path: Path) -> None:
    from_keys = StateBackendConfig.from_settings(
        {
            "state.backend.type": "rocksdb",
            "state.backend.incremental": "true",
            "state.backend.rocksdb.localdir": str(tmp_path),
            "state.backend.rocksdb.memory.fixed-per-slot": "512 mb",
            "state.backend.rocksdb.memory.write-buffer-ratio": "0.25",
            "state.backend.rocksdb.memory.write-cache-ratio": "0.1",
            "state.backend.rocksdb.compaction.style": "UNIVERSAL",
            "state.backend.rocksdb.bloom-filter.bits-per-key": "20",
            "state.backend.rocksdb.memory.partitioned-index-filters": "false",
            "state.backend.changelog.periodic-materialize.interval": "5 min",
            "execution.checkpointing.interval": "10 s",  # not a state key: left to the caller
        }
    )
    in_code = StateBackendConfig(
        type="rocksdb", incremental=True, local_dir=str(tmp_path), memory=512 << 20, write_buffer_ratio=0.25,
        write_cache_ratio=0.1, changelog_materialize_interval=300, compaction_style="universal",
        bloom_bits_per_key=20, partitioned_index_filters=False,
    )  # fmt: skip
    assert from_keys == in_code
    layered = StateBackendConfig.from_settings(
        {
            "state.backend.type": "hashmap",
            "state.backend.changelog.enabled": "true",
            "state.backend.local-recovery": "true",
            "taskmanager.state.local.root-dirs": str(tmp_path / "copies"),
        }
    )
    assert (layered.changelog, layered.local_recovery, layered.local_recovery_dir) == (True, True, str(tmp_path / "copies"))
    assert isinstance(create_state_backend(layered), LayeredStateBackend)
    assert StateBackendConfig.from_settings({"state.backend": "HashMap"}, base=in_code).type == "hashmap"
    assert isinstance(create_state_backend(in_code), RocksDBStateBackend)
    assert isinstance(create_state_backend(StateBackendConfig()), HashMapStateBackend)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"state.backend.type": "filesystem2"}, "state.backend.type: 'filesystem2' is not allowed (allowed: hashmap, rocksdb)"),
        ({"state.backend.incremental": "yes"}, "state.backend.incremental: 'yes' is not a boolean"),
        ({"state.backend.rocksdb.memory.fixed-per-slot": "lots"}, "is not a memory size"),
        ({"state.backend.rocksdb.memory.fixed-per-slot": "1 mb"}, "memory must be at least 16 mb"),
        ({"state.backend.rocksdb.memory.write-buffer-ratio": "1.5"}, "write_buffer_ratio must be a number between 0 and 1"),
        ({"state.backend.rocksdb.memory.write-cache-ratio": "1"}, "write_cache_ratio must be a number from 0 (no cache) to below 1"),
        ({"state.backend.rocksdb.memory.write-cache-ratio": "many"}, "write-cache-ratio: 'many' is not a number"),
        ({"state.backend.rocksdb.compaction.style": "fifo"}, "compaction.style: 'fifo' is not allowed (allowed: level, universal)"),
        ({"state.backend.rocksdb.bloom-filter.bits-per-key": "0.5"}, "bloom_bits_per_key must be a number from 1 to 64"),
        ({"state.backend.rocksdb.memory.partitioned-index-filters": "on"}, "partitioned-index-filters: 'on' is not a boolean"),
        ({"state.backend.changelog.periodic-materialize.interval": "600"}, "is not a duration"),
        ({"state.backend.changelog.enabled": "maybe"}, "state.backend.changelog.enabled: 'maybe' is not a boolean"),
        ({"state.backend.local-recovery": "1"}, "state.backend.local-recovery: '1' is not a boolean"),
        ({"taskmanager.state.local.root-dirs": " "}, "taskmanager.state.local.root-dirs: must not be empty"),
    ],
)
def test_wrong_values_are_one_line_errors_naming_the_option(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        StateBackendConfig.from_settings(settings)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_python_options_are_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"type: 'memory' is not allowed \(allowed: 'hashmap', 'rocksdb'\)") as info:
        StateBackendConfig(type="memory")  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"unknown option 'incremantal' \(did you mean 'incremental'\? allowed: "):
        StateBackendConfig(incremantal=True)  # type: ignore[call-arg]
    config = StateBackendConfig()
    with pytest.raises(Exception, match="frozen"):
        config.type = "rocksdb"  # type: ignore[misc]


def test_memory_sizes_read_as_flink_reads_them() -> None:
    assert parse_memory_size("m", "64 mb") == 64 << 20
    assert parse_memory_size("m", "1gb") == 1 << 30
    assert parse_memory_size("m", "1.5 g") == 3 << 29
    assert parse_memory_size("m", "4096") == 4096
    assert parse_memory_size("m", 123) == 123


def test_every_key_names_a_field() -> None:
    fields = set(StateBackendConfig.model_fields)
    assert {field for field, _ in STATE_KEYS.values()} <= fields


def test_the_rocksdb_backend_travels_without_its_native_resources(tmp_path: Path) -> None:
    backend = create_state_backend(StateBackendConfig(type="rocksdb", local_dir=str(tmp_path)))
    assert backend.resources is not None
    copy = pickle.loads(pickle.dumps(backend))
    assert copy.config == backend.config and copy._resources is None
