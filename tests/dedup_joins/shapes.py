"""The fault suite's shapes for deduplication and the joins (tests/faults/shapes.py conventions): each
pipeline carries ``reference()``, its output computed in pure Python over the whole input."""

from __future__ import annotations

from typing import Any

from sluice import Pipeline
from sluice.connectors.generator import GeneratorSource

from tests.dedup_joins import data
from tests.faults.shapes import Build, Shape, _Lingering


def _source(b: Build, rows: data.Rows, splits: int, per_split: int, name: str) -> GeneratorSource:
    return _Lingering(
        num_splits=splits, records_per_split=per_split, batch_size=b.rng.choice([10, 25, 60]), rows=rows,
        name=name, rows_per_second=b.rate,
    )  # fmt: skip


def _dedup(p: Pipeline, b: Build, keep: str) -> None:
    rng = b.rng
    splits, per_split = rng.randint(1, 4), rng.choice([200, 400, 700])
    period, within = rng.choice([5, 13, 29]), rng.choice([50, 150, 400])
    rows = data.events(per_split, period)
    s = p.source(_source(b, rows, splits, per_split, "events"), parallelism=b.par())
    s = s.map_batches(lambda x: x, schema=data.EVENTS, name="typed")
    out = s.deduplicate(
        "k", within=within / 1000, event_time="ts", keep=keep, order_by="ord" if keep == "last" else None,
        parallelism=b.par(),
    )  # fmt: skip
    out.sink(b.sink(), parallelism=b.par())
    p.reference = lambda: data.as_rows(  # type: ignore[attr-defined]
        data.dedup_reference(data.table_rows(rows, splits, per_split), within, keep)
    )


def dedup_first(p: Pipeline, b: Build) -> None:
    _dedup(p, b, "first")


def dedup_last(p: Pipeline, b: Build) -> None:
    _dedup(p, b, "last")


def join_latest(p: Pipeline, b: Build) -> None:
    rng = b.rng
    customers, how = rng.choice([7, 30]), rng.choice(["inner", "left"])
    f_splits, f_per = rng.randint(1, 3), rng.choice([200, 400])
    d_splits, d_per = rng.randint(1, 3), rng.choice([40, 120])
    f_rows, d_rows = data.facts(f_per, customers), data.dims(d_splits, customers)
    fact = p.source(_source(b, f_rows, f_splits, f_per, "facts"), parallelism=b.par())
    fact = fact.map_batches(lambda x: x, schema=data.FACTS, name="typed-facts")
    dim = p.source(_source(b, d_rows, d_splits, d_per, "dims"), parallelism=b.par())
    dim = dim.map_batches(lambda x: x, schema=data.DIMS, name="typed-dims")
    # table_idle_timeout=None: the reference is exact only if no stall of a loaded machine lets the table side
    # go idle while it still has rows to deliver (the default is tested in test_joins.py, its rows delivered)
    fact.join_latest(dim, on="cust", how=how, event_time="ts", table_idle_timeout=None, parallelism=b.par()).sink(
        b.sink()
    )
    p.reference = lambda: data.as_rows(  # type: ignore[attr-defined]
        data.latest_reference(data.table_rows(f_rows, f_splits, f_per), data.table_rows(d_rows, d_splits, d_per), how)
    )


def interval(p: Pipeline, b: Build) -> None:
    rng = b.rng
    customers = rng.choice([5, 20])
    lower = rng.choice([-60, -20, 0])
    upper = lower + rng.choice([0, 35, 100])  # may be negative too: right records before left ones
    a_splits, a_per = rng.randint(1, 3), rng.choice([150, 300])
    b_splits, b_per = rng.randint(1, 3), rng.choice([100, 200])
    a_rows, b_rows = data.facts(a_per, customers), data.facts(b_per, customers, step=15, offset=5)
    a = p.source(_source(b, a_rows, a_splits, a_per, "left"), parallelism=b.par())
    a = a.map_batches(lambda x: x, schema=data.FACTS, name="typed-left")
    o = p.source(_source(b, b_rows, b_splits, b_per, "right"), parallelism=b.par())
    o = o.map_batches(lambda x: x, schema=data.FACTS, name="typed-right")
    joined = a.interval_join(o, on="cust", between=(f"{lower} ms", f"{upper} ms"), event_time="ts", parallelism=b.par())
    joined.sink(b.sink())
    p.reference = lambda: data.as_rows(  # type: ignore[attr-defined]
        data.interval_reference(
            data.table_rows(a_rows, a_splits, a_per), data.table_rows(b_rows, b_splits, b_per), lower, upper
        )
    )


SHAPES = [Shape("dedup_first", dedup_first), Shape("dedup_last", dedup_last), Shape("join_latest", join_latest),
          Shape("interval", interval)]  # fmt: skip
SHAPE: dict[str, Any] = {s.name: s for s in SHAPES}
