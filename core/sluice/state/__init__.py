"""Keyed and operator state: key groups, stable hashing, state backends (hashmap and RocksDB behind one SPI,
:mod:`sluice.state.spi`), serializers, TTL, canonical savepoints and the shared-state registry."""

__all__: list[str] = []
