"""Types of the native Kafka consumer (native/src, built by setuptools-rust; see native_reader.py)."""

from typing import Any

import pyarrow as pa

librdkafka_version: str

class KafkaNativeError(Exception):
    """A librdkafka call failed: ``args`` is ``(code, text)``."""

class Consumer:
    def __init__(
        self,
        conf: list[tuple[str, str]],
        *,
        need_ts: bool = False,
        need_keys: bool = False,
        need_headers: bool = False,
        json_schema: pa.Schema | None = None,
        wire: bool | None = None,
        max_record_bytes: int | None = None,
    ) -> None: ...
    def consume(self, max_messages: int, timeout_s: float) -> tuple[Any, list[tuple[Any, ...]]]: ...
    def configure_wire(
        self,
        target: pa.Schema,
        json: list[tuple[int, pa.Schema]],
        avro: list[tuple[int, str, str | None, str]],
        bad: list[tuple[int, str]],
    ) -> list[tuple[int, str]]: ...
    def incremental_assign(self, tps: list[tuple[str, int, int, int | None]]) -> None: ...
    def incremental_unassign(self, tps: list[tuple[str, int]]) -> None: ...
    def commit(self, offsets: list[tuple[str, int, int]], asynchronous: bool = True) -> None: ...
    def get_watermark_offsets(self, topic: str, partition: int, timeout_s: float) -> tuple[int, int]: ...
    def close(self) -> list[tuple[Any, ...]]: ...
    @property
    def closed(self) -> bool: ...

class WireDecoder:
    def __init__(self, framed: bool = True) -> None: ...
    def configure(
        self,
        target: pa.Schema,
        json: list[tuple[int, pa.Schema]],
        avro: list[tuple[int, str, str | None, str]],
        bad: list[tuple[int, str]],
    ) -> list[tuple[int, str]]: ...
    def decode(self, values: pa.Array, max_record_bytes: int | None = None) -> tuple[Any, Any, list[tuple[int, str]], int] | None: ...
