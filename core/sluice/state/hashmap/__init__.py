"""The hashmap state backend: keyed state as Python objects in memory, copy-on-write snapshots."""

from sluice.state.hashmap.backend import HashMapKeyedStateBackend, HashMapStateBackend

__all__ = ["HashMapKeyedStateBackend", "HashMapStateBackend"]
