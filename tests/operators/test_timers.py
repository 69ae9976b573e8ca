"""Timers of keyed process functions in whole jobs: event-time timers fire on watermarks and survive a
restore, processing-time timers fire; on both runtimes (the ``runtime`` fixture, tests/runtimes.py)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sluice import CheckpointConfig, FixedDelayRestart, KeyedProcessFunction, Pipeline, ValueStateDescriptor
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed


class Sessions(KeyedProcessFunction):
    """Emits a key's count when event time passes its last row + 50 ms (event-time timer)."""

    def open(self, ctx: Any) -> None:
        self.n = ValueStateDescriptor("n", 0)

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> None:
        st = ctx.state(self.n)
        st.update(st.value() + rows.num_rows)
        ctx.timer_service.register_event_time_timer(pc.max(rows.column("ts")).as_py() + 50)

    def on_timer(self, timestamp: int, key: Any, ctx: Any) -> list[dict[str, Any]]:
        st = ctx.state(self.n)
        out = [{"k": key, "n": st.value(), "at": timestamp}]
        st.clear()
        return out


def test_event_time_timers_fire_on_watermarks_and_survive_restore(tmp_path, runtime: str) -> None:
    from sluice.testing.faults import FaultInjector

    src = GeneratorSource(num_splits=1, records_per_split=500, batch_size=25, step_ms=10, num_keys=5)
    p = Pipeline(
        "timers",
        checkpoint=CheckpointConfig(interval=0.02, storage=f"{tmp_path}/chk"),
        restart=FixedDelayRestart(attempts=3, delay=0),
    )
    p.source(src).key_by("key").process(Sessions(), parallelism=2).sink(
        TwoPhaseCommitTestSink(f"{tmp_path}/out")
    )
    p.run(runtime=runtime, restore="none", faults=FaultInjector(point="process", after=8))
    out = read_committed(f"{tmp_path}/out")
    assert out is not None
    # timers fire only when the watermark passes them: the last timer per key (beyond the final watermark)
    # never fires; every count fired covers rows that were counted exactly once
    assert out.num_rows > 0 and sum(out.column("n").to_pylist()) <= 500


def test_processing_time_timer_fires(tmp_path, runtime: str) -> None:
    class Later(KeyedProcessFunction):
        def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> None:
            ctx.timer_service.register_processing_time_timer(ctx.timer_service.current_processing_time() + 20)

        def on_timer(self, timestamp: int, key: Any, ctx: Any) -> list[dict[str, Any]]:
            return [{"k": key}]

    src = GeneratorSource(num_splits=1, records_per_split=200, batch_size=10, num_keys=3, rows_per_second=200)
    p = Pipeline("ptimers", checkpoint=CheckpointConfig(interval=0.05, storage=f"{tmp_path}/chk"))
    p.source(src).key_by("key").process(Later()).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    p.run(runtime=runtime, restore="none")
    assert read_committed(f"{tmp_path}/out") is not None
