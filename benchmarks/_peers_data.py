"""benchmarks/peers.py's data and judges: the input records, their producer, the check that each partition is in
event-time order, the windows computed from the input with pyarrow, and the comparison of every engine's
output with the input (never with an engine's own counters)."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq
from _common import same_table  # type: ignore[import-not-found]
from _peers_watch import KafkaWatch  # type: ignore[import-not-found]
from confluent_kafka import Consumer, Producer, TopicPartition

PARTITIONS = 4
WINDOW_MS = 60_000
DELAY_MS = 10_000
BASE_TS = 1_700_000_000_000
SCHEMA = pa.schema([("user", pa.int64()), ("amount", pa.float64()), ("ts", pa.int64())])


def records(n: int, keys: int, minutes: int) -> pa.Table:
    """The data records (``user`` in partition ``user % PARTITIONS``) and one sentinel per partition an hour
    of event time after them."""
    i = np.arange(n, dtype=np.int64)
    data = pa.table({"user": (i * 7919) % keys, "amount": ((i * 37) % 1000) / 10.0,
                     "ts": BASE_TS + i * (minutes * 60_000) // n}, schema=SCHEMA)  # fmt: skip
    far = BASE_TS + minutes * 60_000 + 3_600_000
    first = -(-keys // PARTITIONS) * PARTITIONS  # sentinel users: past every data user, one per partition
    sentinels = pa.table({"user": first + np.arange(PARTITIONS),
                          "amount": np.zeros(PARTITIONS), "ts": np.full(PARTITIONS, far)}, schema=SCHEMA)  # fmt: skip
    return pa.concat_tables([data, sentinels])


#: the input's producer: idempotent, because without it librdkafka's retry of a failed produce request (a
#: just-created partition whose leader is not ready yet, on a loaded machine) lands that batch behind the
#: batches sent after it, and a partition is no longer in event-time order (seen: records a minute of event
#: time behind their partition's sentinel an hour ahead, late for every engine's watermark)
PRODUCER_CONF = {"linger.ms": 20, "batch.num.messages": 10_000, "queue.buffering.max.messages": 2_000_000,
                 "enable.idempotence": True, "log_level": 0}  # fmt: skip


def produce(bootstrap: str, topic: str, table: pa.Table) -> None:
    p = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONF})
    for u, a, t in zip(*(table.column(c).to_pylist() for c in SCHEMA.names), strict=True):
        while True:
            try:  # each partition in event-time order: no record is late
                p.produce(topic, b'{"user": %d, "amount": %r, "ts": %d}' % (u, a, t), key=b"%d" % u, partition=u % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(600) != 0:
        raise RuntimeError("records not delivered")


def _decode(values: list[bytes]) -> pa.Table:
    """JSON record values as a table of SCHEMA."""
    return pajson.read_json(pa.py_buffer(b"\n".join(values)), parse_options=pajson.ParseOptions(explicit_schema=SCHEMA))


def check_order(bootstrap: str, topic: str) -> int:
    """Read ``topic`` back with a plain consumer and raise unless each partition's ``ts`` never goes back
    (the premise of the ``window`` case: no record is late for a watermark ``DELAY_MS`` behind); returns the
    records read."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-order-check", "enable.auto.commit": False,
                  "log_level": 0})  # fmt: skip
    try:
        parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts if ends[p] > 0])
        last, pos, n, deadline = dict.fromkeys(parts, -(2**63)), dict.fromkeys(parts, 0), 0, time.time() + 600
        while any(pos[p] < ends[p] for p in parts):
            if time.time() > deadline:
                raise RuntimeError(f"{topic}: could not read the input back within 600 s")
            msgs = [m for m in c.consume(10_000, 1.0) if m.error() is None]
            if not msgs:
                continue
            ts = _decode([m.value() for m in msgs]).column("ts").to_pylist()
            for m, t in zip(msgs, ts, strict=True):
                p = m.partition()
                if t < last[p]:
                    raise RuntimeError(f"{topic}[{p}] offset {m.offset()}: ts {t} is {last[p] - t} ms behind the "
                                       "records before it: the input is not in event-time order per partition")  # fmt: skip
                last[p], pos[p] = t, m.offset() + 1
            n += len(msgs)
        return n
    finally:
        c.close()


def reference_windows(table: pa.Table) -> pa.Table:
    """The windows of the data records (the sentinels' windows never close), by pyarrow's group_by."""
    data = table.filter(pc.less(table.column("ts"), pc.max(table.column("ts"))))
    start = pc.multiply(pc.divide(data.column("ts"), WINDOW_MS), WINDOW_MS)
    agg = data.append_column("window_start", start).group_by(["user", "window_start"]).aggregate(
        [("user", "count"), ("amount", "sum"), ("amount", "max")])  # fmt: skip
    return agg.rename_columns(["user", "window_start", "count", "sum_amount", "max_amount"])


def normalized(engine: str, got: pa.Table, case: str) -> pa.Table:
    """An engine's output as (user, amount, ts) or (user, window_start ms, count, sum_amount, max_amount)."""
    if engine == "quix":
        got = got.append_column("user", pc.cast(got.column("_key"), pa.int64())) if case == "window" else got
        if case == "window":
            got = got.append_column("window_start", got.column("start"))
    if case != "window":
        return got.select(SCHEMA.names).cast(SCHEMA)
    ws = got.column("window_start")
    if pa.types.is_timestamp(ws.type):
        ws = pc.cast(pc.cast(ws, pa.timestamp("ms")), pa.int64())
    return pa.table({"user": pc.cast(got.column("user"), pa.int64()), "window_start": pc.cast(ws, pa.int64()),
                     "count": pc.cast(got.column("count"), pa.int64()), "sum_amount": got.column("sum_amount"),
                     "max_amount": got.column("max_amount")})  # fmt: skip


def check(label: str, case: str, got: pa.Table, table: pa.Table, ref: pa.Table | None) -> dict[str, Any]:
    """Compare an output with the input (or the windows computed from it); raise on any difference."""
    if case != "window":
        dupes = got.num_rows - table.num_rows
        if dupes > 0:  # at least once: compare the distinct records, report the copies
            got = pa.Table.from_pylist(list({json.dumps(r): r for r in got.to_pylist()}.values()), SCHEMA)
        differs = same_table(got, table, keys=("ts", "user", "amount"))
        if differs is not None:
            raise RuntimeError(f"{label}: the output differs from the input ({differs})")
        return {"duplicates": max(0, dupes)}
    assert ref is not None
    key = [("user", "ascending"), ("window_start", "ascending")]
    g, r = got.sort_by(key), ref.sort_by(key)
    same = g.num_rows == r.num_rows and all(g.column(c).equals(r.column(c)) for c in ("user", "window_start", "count", "max_amount"))
    if not same or not pc.all(pc.less(pc.abs(pc.subtract(g.column("sum_amount"), r.column("sum_amount"))), 1e-6)).as_py():
        raise RuntimeError(f"{label}: {g.num_rows} window rows differ from the {r.num_rows} computed from the input")
    return {}


def read_output(watch: Any, case: str) -> pa.Table:
    if isinstance(watch, KafkaWatch):
        values = [v for _, vs in watch.batches for v in vs]
        return _decode(values)
    tables = [pq.read_table(p) for p in watch.files]
    return pa.concat_tables(tables, promote_options="permissive") if tables else SCHEMA.empty_table()
