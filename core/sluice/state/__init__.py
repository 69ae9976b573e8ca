"""Keyed and operator state: key groups, stable hashing, the copy-on-write backend."""

__all__: list[str] = []
