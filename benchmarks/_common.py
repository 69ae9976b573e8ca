"""Helpers shared by the benchmark scripts: the counting sink, and how every script measures a comparison.

The rules (docs/benchmarks.md, "How a comparison is taken"): the sides of a comparison run in alternated,
repeated rounds (:func:`alternate`, at least 3, each side warmed up alike first), every round is printed
and reported, a ratio is the median of the per-round ratios with its spread (min-max) beside it
(:func:`ratios`, :func:`report`), the metric is named before the run (:func:`add_round_options`: wall time
by default, CPU time of the whole process tree, :func:`tree_cpu_seconds`, printed beside), and a target is
met only when the median of the named metric meets it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import pyarrow as pa
from sluice.sink import Sink, SinkWriter

__all__ = [
    "METRICS",
    "CountSink",
    "Stopwatch",
    "Timing",
    "add_round_options",
    "alternate",
    "check_rounds",
    "load_average",
    "ratios",
    "replay_changes",
    "report",
    "same_table",
    "tree_cpu_seconds",
    "with_runs",
]

T = TypeVar("T")

#: the metrics a comparison can be named by: wall time (the default) and CPU time of the process tree
METRICS = ("wall", "cpu")


class CountSink(Sink[int]):
    """Counts rows and commits nothing: isolates engine cost from I/O."""

    name = "count"

    def create_writer(self, ctx: Any, restored: list[Any]) -> SinkWriter[int]:
        return _CountWriter()


class _CountWriter(SinkWriter[int]):
    def __init__(self) -> None:
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows

    def prepare_commit(self, checkpoint_id: int) -> list[int]:
        return []


# -- measuring -------------------------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, CPU ticks: user + system, its own and its waited-for children's) of a process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None  # exited since the listing
    fields = data[data.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    return int(fields[1]), sum(int(x) for x in fields[11:15])  # ppid; utime stime cutime cstime


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and every process below it (brokers, JVMs, database servers, child
    processes), each with its waited-for children: the CPU time of the whole process tree so far.

    A child that exits between two calls moves from its own count into its parent's waited-for count, so a
    difference of two calls counts it once."""
    stats = {pid: s for pid in os.listdir("/proc") if pid.isdigit() and (s := _proc_stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(int(pid))
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        s = stats.get(str(pid))
        if s is not None:
            total += s[1]
        todo.extend(children.get(pid, ()))
    return total / _TICK


@dataclass(frozen=True)
class Timing:
    """One run of one side: wall seconds and CPU seconds of the whole process tree over the same span."""

    wall: float
    cpu: float

    def of(self, metric: str) -> float:
        return self.wall if metric == "wall" else self.cpu

    def __str__(self) -> str:
        return f"{self.wall:7.2f} s wall, {self.cpu:7.2f} CPU-s"


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.timing``: wall and process-tree CPU time of the block."""

    timing: Timing

    def __enter__(self) -> Stopwatch:
        self._c0 = tree_cpu_seconds()
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> Timing:
        """End the span now (before the block ends, e.g. when the last record became visible)."""
        if not hasattr(self, "timing"):
            self.timing = Timing(time.perf_counter() - self._t0, tree_cpu_seconds() - self._c0)
        return self.timing

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


def load_average() -> float:
    """The 1-minute load average (recorded before and after a run: the machine may be shared)."""
    return round(os.getloadavg()[0], 1)


# -- rounds ----------------------------------------------------------------------------------------------
def add_round_options(parser: argparse.ArgumentParser, rounds: int = 3) -> None:
    """``--rounds`` (at least 3), ``--metric`` (named before the run) and ``--no-warmup``."""
    parser.add_argument("--rounds", type=int, default=rounds, help=f"alternated rounds, at least 3 (default {rounds})")
    parser.add_argument("--metric", choices=METRICS, default="wall",
                        help="the metric the targets are judged by (default wall; the other is printed beside)")  # fmt: skip
    parser.add_argument("--no-warmup", action="store_true", help="no untimed run of each side before the rounds")


def check_rounds(args: argparse.Namespace) -> None:
    if args.rounds < 3:
        raise SystemExit(f"--rounds must be at least 3 (got {args.rounds}): a median of fewer says little")
    print(f"metric: {args.metric} time (named before the run; the other printed beside), {args.rounds} "
          f"alternated rounds, warm-up {'off' if args.no_warmup else 'on'}, load average {load_average()}",
          flush=True)  # fmt: skip


def alternate(
    sides: Sequence[str],
    rounds: int,
    run: Callable[[str, int], T],
    *,
    warmup: bool = True,
    show: Callable[[T], str] = str,
) -> dict[str, list[T]]:
    """Run every side once per round, ``rounds`` rounds, the order rotated each round (A B C, B C A, C A B
    ...: no side always runs first or last); with ``warmup`` one untimed run of each side first (round 0,
    not returned). ``run(side, round)`` returns the side's measurement; every one is printed."""
    out: dict[str, list[T]] = {s: [] for s in sides}
    for r in range(0 if warmup else 1, rounds + 1):
        order = list(sides[(r - 1) % len(sides) :]) + list(sides[: (r - 1) % len(sides)]) if r else list(sides)
        for side in order:
            got = run(side, r)
            print(f"  {'warm-up' if r == 0 else f'round {r}'}: {side:22s} {show(got)}", flush=True)
            if r:
                out[side].append(got)
    return out


def _verdict(value: float, target: str) -> str:
    op, bound = target.split()
    met = value >= float(bound) if op == ">=" else value <= float(bound)
    return f"target {target}: {'met' if met else 'NOT MET'}"


def report(result: dict[str, Any], key: str, runs: Sequence[float], target: str | None = None, digits: int = 3) -> None:
    """``key`` = the median of ``runs``, ``<key>_runs`` every round, ``<key>_spread`` [min, max] into
    ``result``; printed with the verdict against ``target`` (``">= 0.5"``, ``"<= 0.1"``), from the median."""
    med = statistics.median(runs)
    result[key] = round(med, digits)
    result[f"{key}_runs"] = [round(x, digits) for x in runs]
    result[f"{key}_spread"] = [round(min(runs), digits), round(max(runs), digits)]
    verdict = f"  ({_verdict(med, target)}, from the median)" if target else ""
    print(f"{key}: median {med:.{digits}f}, spread {min(runs):.{digits}f}-{max(runs):.{digits}f}, rounds "
          f"{', '.join(f'{x:.{digits}f}' for x in runs)}{verdict}", flush=True)  # fmt: skip


def ratios(
    result: dict[str, Any],
    key: str,
    a: Sequence[Timing],
    b: Sequence[Timing],
    metric: str,
    target: str | None = None,
    *,
    of: str = "rate",
    work: tuple[float, float] = (1.0, 1.0),
    digits: int = 3,
) -> None:
    """Per-round ratios of side ``a`` to side ``b`` (round i of each): ``of="rate"`` (work per second of a /
    of b, higher is better for a) or ``"time"`` (seconds of a / of b). ``key`` is judged by ``metric``;
    ``<key>_<other metric>`` is reported beside it, without a verdict."""
    for m in (metric, *(x for x in METRICS if x != metric)):
        if of == "rate":
            runs = [(work[0] / x.of(m)) / (work[1] / y.of(m)) for x, y in zip(a, b, strict=True)]
        else:
            runs = [x.of(m) / y.of(m) for x, y in zip(a, b, strict=True)]
        report(result, key if m == metric else f"{key}_{m}", runs, target if m == metric else None, digits)


# -- checking --------------------------------------------------------------------------------------------
def replay_changes(base: pa.Table, changes: Sequence[pa.Table], keys: Sequence[str] = ("id",)) -> pa.Table:
    """The table ``base`` after ``changes`` (change tables: the row columns, ``_sluice_op`` and
    ``_sluice_order``), replayed in order by DuckDB, apart from sluice's merge code: per batch of changes,
    the last change of each key (by ``_sluice_order``) replaces its row, or removes it if it is a delete."""
    import duckdb

    cols = ", ".join(f'"{c}"' for c in base.column_names)
    on = ", ".join(f'"{k}"' for k in keys)
    con = duckdb.connect()
    state = base
    for batch in changes:
        con.register("state", state)
        con.register("batch", batch)
        state = con.sql(
            f"""WITH last AS (
                    SELECT * FROM batch QUALIFY row_number() OVER (PARTITION BY {on} ORDER BY _sluice_order DESC) = 1)
                SELECT {cols} FROM state ANTI JOIN last USING ({on})
                UNION ALL SELECT {cols} FROM last WHERE _sluice_op <> 2"""  # 2: Op.DELETE
        ).to_arrow_table()
        con.unregister("state")
        con.unregister("batch")
    return state.cast(base.schema)


def same_table(got: pa.Table, expected: pa.Table, keys: Sequence[str] = ("id",)) -> str | None:
    """None when ``got`` holds exactly the rows of ``expected`` (any order, every column compared), else
    what differs."""
    got = got.select(expected.column_names).cast(expected.schema)
    if got.num_rows != expected.num_rows:
        return f"{got.num_rows} rows, expected {expected.num_rows}"
    order = [(k, "ascending") for k in keys]
    g, e = got.sort_by(order), expected.sort_by(order)
    bad = [c for c in expected.column_names if not g.column(c).equals(e.column(c))]
    return f"columns {bad} differ" if bad else None


def with_runs(result: dict[str, Any], key: str, values: Mapping[str, Sequence[Timing]]) -> None:
    """Every round's timings per side under ``key`` (for the RESULT)."""
    result[key] = {s: [[round(t.wall, 3), round(t.cpu, 3)] for t in ts] for s, ts in values.items()}
