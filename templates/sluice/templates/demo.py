"""``sluice demo``: a small bounded job, run end to end, that prints what it committed."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from typing import Any

import click
import pyarrow as pa
import pyarrow.compute as pc
from sluice.api import Pipeline
from sluice.config import CheckpointConfig, FixedDelayRestart
from sluice.errors import SluiceError
from sluice.functions import KeyedProcessFunction
from sluice.state.api import ValueStateDescriptor

__all__ = ["RunningTotals", "build_demo", "command", "run_demo"]


class RunningTotals(KeyedProcessFunction):
    """Per customer: running order count and amount, emitted once per batch of that customer's orders."""

    def open(self, ctx: Any) -> None:
        self.orders = ValueStateDescriptor("orders", 0)
        self.amount = ValueStateDescriptor("amount", 0)

    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> list[dict[str, Any]]:
        n, a = ctx.state(self.orders), ctx.state(self.amount)
        n.update(n.value() + rows.num_rows)
        a.update(a.value() + pc.sum(rows.column("amount")).as_py())
        return [
            {
                "customer": key,
                "orders": n.value(),
                "amount": a.value(),
                "last_id": rows.column("id")[-1].as_py(),
            }
        ]


def _orders(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            batch.column("id"),
            pc.cast(batch.column("key"), pa.int32()),
            batch.column("value"),
            batch.column("ts"),
        ],
        names=["id", "customer", "amount", "ts"],
    )


def build_demo(out: str, parallelism: int = 2) -> Pipeline:
    """Generator of 20k orders -> running totals per customer -> Parquet files (two-phase commit)."""
    from sluice.connectors.generator import GeneratorSource
    from sluice.sinks.files import FileSink

    p = Pipeline(
        "sluice-demo",
        parallelism=parallelism,
        checkpoint=CheckpointConfig(interval=0.5, storage=f"{out}/checkpoints"),
        restart=FixedDelayRestart(attempts=2, delay=0.5),
    )
    orders = p.source(GeneratorSource(num_splits=4, records_per_split=5000, batch_size=500, num_keys=20))
    totals = orders.map_batches(_orders, name="orders").filter(pc.field("amount") > 0, name="paid")
    totals.key_by("customer").process(RunningTotals(), name="totals").sink(
        FileSink(f"{out}/totals", format="parquet"), name="parquet"
    )
    return p


def run_demo(runtime: str = "spark", out: str | None = None, echo: Callable[[str], Any] = print) -> pa.Table:
    """Run the demo job and print a summary of the committed output."""
    import pyarrow.dataset as ds

    out = out or tempfile.mkdtemp(prefix="sluice-demo-")
    echo(
        f"sluice demo: 20,000 orders -> running totals per customer -> Parquet in {out}/totals ({runtime} runtime)"
    )
    t0 = time.monotonic()
    result = build_demo(out).run(runtime=runtime, restore="none")  # type: ignore[arg-type, unused-ignore]
    took = time.monotonic() - t0
    table = ds.dataset(f"{out}/totals", format="parquet").to_table()
    final = table.group_by("customer").aggregate([("orders", "max"), ("amount", "max")]).sort_by("customer")
    echo(
        f"job {result.job_id} {result.status} in {took:.1f}s; {result.checkpoints and len(result.checkpoints)} "
        f"checkpoints, last completed: {result.last_checkpoint}"
    )
    echo(
        f"committed {table.num_rows} rows in {len(ds.dataset(f'{out}/totals', format='parquet').files)} "
        f"visible Parquet file(s); final totals per customer:"
    )
    for row in final.to_pylist()[:20]:
        echo(f"  customer {row['customer']:>2}: {row['orders_max']:>5} orders, amount {row['amount_max']:>9}")
    total_orders = sum(r["orders_max"] for r in final.to_pylist())
    from sluice.connectors.generator import GeneratorSource

    paid = pc.sum(pc.greater(GeneratorSource(num_splits=4, records_per_split=5000).expected().column("value"), 0))
    expected = paid.as_py()
    verdict = "exactly once" if total_orders == expected else "MISMATCH"
    echo(f"paid orders counted: {total_orders:,} of {expected:,} expected -> {verdict}")
    return table


@click.command("demo")
@click.option("--runtime", type=click.Choice(["spark", "local"]), default="spark", show_default=True)
@click.option("--out", default=None, help="Output directory (default: a new temporary directory).")
def command(runtime: str, out: str | None) -> None:
    """Run a small job end to end on the embedded default runtime and print what it committed."""
    try:
        run_demo(runtime, out, echo=click.echo)
    except SluiceError as exc:
        raise click.ClickException(str(exc)) from exc
