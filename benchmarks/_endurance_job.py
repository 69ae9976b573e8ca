"""The job of benchmarks/endurance.py, run by ``sluice run`` in a process of its own (killed and restarted).

Kafka (JSON events ``{"seq", "id", "key", "value", "ts"}``) -> a raw branch to Parquet, and
deduplicate(id) on RocksDB with incremental checkpoints -> 10 s tumbling windows per key (count and sum of
value) -> Parquet; both file sinks with compaction on. Settings come from the environment:

  ENDURANCE_BOOTSTRAP, ENDURANCE_TOPIC        the broker and the topic
  ENDURANCE_ROOT                              checkpoints, output and RocksDB folders live under it
  ENDURANCE_PARALLELISM (2), ENDURANCE_INTERVAL (2.0 s), ENDURANCE_COMPACT_CHECKPOINTS (15)
  ENDURANCE_STOP_AT                           JSON {partition: offset}: read up to there and finish
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pyarrow as pa
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import CompactionPolicy, FileSink
from sluice.state.config import StateBackendConfig
from sluice.windows import Tumbling, count, sum

SCHEMA = pa.schema([("seq", pa.int64()), ("id", pa.int64()), ("key", pa.int64()), ("value", pa.int64()), ("ts", pa.int64())])  # fmt: skip
WINDOW = timedelta(seconds=10)
DEDUP_WITHIN = "1 min"

root = os.environ["ENDURANCE_ROOT"]
topic = os.environ["ENDURANCE_TOPIC"]
parallelism = int(os.environ.get("ENDURANCE_PARALLELISM", "2"))
compact = CompactionPolicy(max_checkpoints=int(os.environ.get("ENDURANCE_COMPACT_CHECKPOINTS", "15")))
stop_at = os.environ.get("ENDURANCE_STOP_AT")

pipeline = Pipeline(
    "endurance",
    parallelism=parallelism,
    checkpoint=CheckpointConfig(
        interval=float(os.environ.get("ENDURANCE_INTERVAL", "2.0")), storage=f"{root}/checkpoints"
    ),
    state_backend=StateBackendConfig(type="rocksdb", incremental=True, local_dir=f"{root}/rocksdb"),
    restart=FixedDelayRestart(attempts=3, delay=1.0),
)
events = pipeline.source(
    KafkaSource(
        os.environ["ENDURANCE_BOOTSTRAP"],
        topic,
        format="json",
        schema=SCHEMA,
        event_time="ts",
        max_out_of_orderness_ms=3_000,
        starting_offsets="earliest",
        stopping_offsets={(topic, int(p)): int(o) for p, o in json.loads(stop_at).items()} if stop_at else None,
        commit_offsets_on_checkpoint=False,
    )
)
events.sink(FileSink(f"{root}/out/raw", format="parquet", compaction=compact), name="raw")
windows = (
    events.deduplicate("id", within=DEDUP_WITHIN, event_time="ts")
    .key_by("key")
    .window(Tumbling(WINDOW), time="ts")
    .aggregate(count(), sum("value"))
)
windows.sink(FileSink(f"{root}/out/windows", format="parquet", compaction=compact), name="windows")


def _diagnose(path: str, every: float = 15.0) -> None:
    """Every ``every`` seconds append one JSON line to ``path``: glibc's heap (mallinfo2: bytes in use, free
    bytes it keeps, mmapped bytes, arenas' size), Python's (tracemalloc with ENDURANCE_DIAGNOSE=2: the top
    allocation sites) and the process's RSS split from /proc/self/smaps_rollup."""
    import ctypes
    import threading
    import time
    import tracemalloc

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    deep = os.environ.get("ENDURANCE_DIAGNOSE") == "2"
    trim_at = float(os.environ.get("ENDURANCE_TRIM_AT", "0"))  # an experiment: malloc_trim(0) at this age
    if deep:
        tracemalloc.start(8)
    started = time.monotonic()

    def loop() -> None:
        nonlocal trim_at
        while True:
            time.sleep(every)
            m = libc.mallinfo2()
            roll = {}
            with open("/proc/self/smaps_rollup") as f:
                for line in f.readlines()[1:]:
                    k, v = line.split(":")
                    roll[k] = int(v.split()[0]) // 1024
            row = {"pid": os.getpid(), "age": round(time.monotonic() - started, 1),
                   "rss_mb": roll.get("Rss"), "anon_mb": roll.get("Anonymous"),
                   "heap_arena_mb": m.arena >> 20, "heap_in_use_mb": m.uordblks >> 20,
                   "heap_free_kept_mb": m.fordblks >> 20, "mmapped_mb": m.hblkhd >> 20,
                   "threads": threading.active_count()}  # fmt: skip
            if trim_at and row["age"] >= trim_at:
                trim_at = 0.0
                t = time.perf_counter()
                libc.malloc_trim(0)
                row["trim_ms"] = round((time.perf_counter() - t) * 1000, 2)
                with open("/proc/self/status") as f:
                    row["rss_after_trim_mb"] = next(int(x.split()[1]) >> 10 for x in f if x.startswith("VmRSS"))
            if deep:
                cur, peak = tracemalloc.get_traced_memory()
                row["python_mb"], row["python_peak_mb"] = cur >> 20, peak >> 20
                top = tracemalloc.take_snapshot().statistics("lineno")[:8]
                row["top"] = [f"{s.size >> 20} MB {s.traceback[0].filename}:{s.traceback[0].lineno}" for s in top]
            with open(path, "a") as out:
                out.write(json.dumps(row) + "\n")

    threading.Thread(target=loop, name="endurance-diagnose", daemon=True).start()


if os.environ.get("ENDURANCE_DIAGNOSE"):
    _diagnose(f"{root}/memory.jsonl")
