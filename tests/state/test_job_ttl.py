"""State TTL inside jobs (issue 24 point 6): a keyed job whose state has a time to live never reads an expired
value, before a crash and after the restore of a checkpoint, on every state backend.

Every read is judged by processing time taken around it, so no verdict depends on how fast the machine is:
the function stamps, in state without a TTL, the time just before and just after each write of the state
with a TTL. A read that returned a value began less than the TTL after the write ended (else the value had
expired: never returned), and a read that ended less than the TTL after the write began returned it (an
unexpired value is not lost). The restart waits longer than the TTL, so every value the restored checkpoint
holds has expired when it is first read: none may come back.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, KeyedProcessFunction, Pipeline, ValueStateDescriptor
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.state.config import StateTtlConfig
from sluice.testing.faults import FaultInjector

from tests.faults.backends import BACKENDS, backend_config
from tests.sinks.tables.paced import Paced

TTL_MS = 1000
RESTART_DELAY_S = 1.5  # longer than the TTL
ROWS = 2 * 400


def now_ms() -> int:
    return int(time.time() * 1000)  # the state backends' processing-time clock


class Expiring(KeyedProcessFunction):
    """Per batch of a key: reads the value with a TTL (the id of the key's last row), then writes it; emits
    what the read saw and the times around the read and the last write."""

    def __init__(self) -> None:
        self.keys: dict[int, set[Any]] = {}  # per subtask (they share this object): keys read since it opened

    def open(self, ctx: Any) -> None:
        self.last = ValueStateDescriptor("last", serializer="int64", ttl=StateTtlConfig(ttl=TTL_MS / 1000))
        self.written = ValueStateDescriptor("written", serializer="int64")  # the same id, no TTL
        self.began = ValueStateDescriptor("began", serializer="int64")
        self.ended = ValueStateDescriptor("ended", serializer="int64")
        self.keys[ctx.subtask] = set()

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> list[dict[str, Any]]:
        last, written = ctx.state(self.last), ctx.state(self.written)
        began, ended = ctx.state(self.began), ctx.state(self.ended)
        before = now_ms()
        value = last.value()
        after = now_ms()
        first = key not in self.keys[ctx.subtask]
        self.keys[ctx.subtask].add(key)
        out = [
            {
                "id": rows.column("id")[0].as_py(), "key": key, "first": first, "value": value,
                "written": written.value(), "began": began.value(), "ended": ended.value(),
                "read_began": before, "read_ended": after,
            }
        ]  # fmt: skip
        out += [{"id": i, "key": key} for i in rows.column("id").to_pylist()[1:]]
        began.update(now_ms())
        last.update(rows.column("id")[-1].as_py())
        ended.update(now_ms())
        written.update(rows.column("id")[-1].as_py())
        return out


SCHEMA = pa.schema(
    [("id", pa.int64()), ("key", pa.int64()), ("first", pa.bool_()), ("value", pa.int64()), ("written", pa.int64()),
     ("began", pa.int64()), ("ended", pa.int64()), ("read_began", pa.int64()), ("read_ended", pa.int64())]
)  # fmt: skip


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb", "hashmap+changelog", "rocksdb+changelog"])
def test_expired_values_are_never_returned_before_and_after_a_restore(backend: str, tmp_path: Path) -> None:
    assert backend in BACKENDS
    # paced by checkpoints (every 5 batches of a reader wait for a checkpoint to complete): the crash at the 4th
    # completion comes while input remains, however slowly checkpoints complete on a loaded machine
    src = Paced(chunk_batches=5, num_splits=2, records_per_split=ROWS // 2, batch_size=10, num_keys=8,
                rows_per_second=400)  # fmt: skip
    p = Pipeline(
        "ttl",
        checkpoint=CheckpointConfig(interval=0.05, storage=f"{tmp_path}/chk"),
        restart=FixedDelayRestart(attempts=2, delay=RESTART_DELAY_S),
        max_parallelism=16,
        state_backend=backend_config(backend, str(tmp_path)),
    )
    p.source(src).key_by("key").process(Expiring(), schema=SCHEMA, parallelism=2).sink(
        TwoPhaseCommitTestSink(f"{tmp_path}/out")
    )
    faults = FaultInjector(point="complete_to_commit", after=3)
    result = p.run(runtime="local", restore="none", faults=faults)
    assert faults.all_fired and result.attempts == 2
    table = read_committed(f"{tmp_path}/out")
    assert table is not None
    assert sorted(table.column("id").to_pylist()) == list(range(ROWS)), "output is not exactly once"
    reads = [r for r in table.to_pylist() if r["read_began"] is not None and r["written"] is not None]
    returned = [r for r in reads if r["value"] is not None]
    for r in returned:
        assert r["read_began"] - r["ended"] < TTL_MS, f"an expired value was returned: {r}"
        assert r["value"] == r["written"], f"a stale value was returned: {r}"
    for r in reads:
        if r["read_ended"] - r["began"] < TTL_MS:
            assert r["value"] == r["written"], f"an unexpired value was lost: {r}"
    restored = [r for r in reads if r["first"]]  # the first read of a key after the restore
    late = [(r["id"], r["key"], r["read_began"] - r["ended"]) for r in restored if r["read_began"] - r["ended"] < TTL_MS]
    assert restored and not late, late
    assert all(r["value"] is None for r in restored), "a value expired in the checkpoint came back after the restore"
    assert returned, "no read came within the TTL of its write"
