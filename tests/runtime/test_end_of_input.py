"""The end of a bounded input: event time runs to its end, so every event-time timer fires (as in Flink,
where a finished source emits the maximum watermark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, FixedDelayRestart, KeyedProcessFunction, Pipeline, ValueStateDescriptor
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.testing.faults import FaultInjector


class FarTimers(KeyedProcessFunction):
    """Counts a key's rows and emits the count at one timer far beyond any row's event time."""

    def open(self, ctx: Any) -> None:
        self.n = ValueStateDescriptor("n", 0)

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> None:
        st = ctx.state(self.n)
        st.update(st.value() + rows.num_rows)
        ctx.timer_service.register_event_time_timer(2**62)  # one timer per key, beyond any row

    def on_timer(self, timestamp: int, key: Any, ctx: Any) -> list[dict[str, Any]]:
        st = ctx.state(self.n)
        out = [{"k": key, "n": st.value()}]
        st.clear()
        return out


@pytest.mark.parametrize("crash", [False, True])
def test_every_event_time_timer_fires_when_a_bounded_input_ends(tmp_path: Path, crash: bool) -> None:
    src = GeneratorSource(num_splits=2, records_per_split=300, batch_size=25, step_ms=10, num_keys=5)
    p = Pipeline(
        "far-timers",
        checkpoint=CheckpointConfig(interval=0.02, storage=f"{tmp_path}/chk"),
        restart=FixedDelayRestart(attempts=3, delay=0),
    )
    p.source(src).key_by("key").process(FarTimers(), parallelism=2).sink(TwoPhaseCommitTestSink(f"{tmp_path}/out"))
    faults = FaultInjector(point="process", after=6) if crash else None
    result = p.run(runtime="local", restore="none", faults=faults)
    if crash:
        assert result.attempts > 1, "the armed crash fired"
    out = read_committed(f"{tmp_path}/out")
    assert out is not None
    # no row's timer is reached by the data's watermarks: they all fire at the end, once per key
    assert sorted(out.column("k").to_pylist()) == sorted(set(out.column("k").to_pylist()))
    assert sum(out.column("n").to_pylist()) == 600
