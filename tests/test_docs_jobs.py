"""Every job example of README.md and docs/*.md runs as written under ``sluice run --runtime local``.

Which blocks: every fenced ``python`` block, except those the page marks as not a whole job: a
``<!-- fragment -->`` line just before the fence (a snippet that assumes ``p``, a source, ...), or
``<!-- example: NAME -->`` (docs/connectors.md's plugin modules, run by tests/connectors/test_docs_examples.py).
A new example is run by this test as soon as it is written; one that is not a job must be marked.

What is changed, and nothing else (the rule README.md states too):

* the broker addresses the examples name (:data:`BROKERS`) become the test broker's (tansu, started here;
  of its quirks, the high watermark under-reporting the last batch does not matter: no example stops at
  ``latest``, the test stops each job with SIGTERM);
* S3 is moto's server: ``AWS_ENDPOINT_URL`` and test credentials in the job's environment, the bucket the
  example names created empty;
* relative paths (``./checkpoints``, ``./out``) are in a fresh folder, the job's working directory.

Each job reads small topics written here (``orders``, ``clicks``, ``views``), runs until its output
equals a reference computed from that input in plain Python (the judge of its pipeline name, below), is
stopped with SIGTERM (a savepoint), and must end with exit status 0, having printed its control endpoint
(so ``Pipeline.run()`` inside the file ran with the command line's runtime, endpoint and progress) and
the savepoint it stopped at; its output must still equal the reference then (nothing written twice).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from tests.kafka_broker import TansuBroker
from tests.sinks.conftest import MotoS3

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: broker addresses the examples may name; each becomes the test broker's
BROKERS = ("kafka:9092", "localhost:9092", "broker:9092")
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_SKIP = re.compile(r"^<!-- (fragment|example: [\w-]+) -->$")
T0 = 1_700_000_040_000  # a minute's start, so windows line up with the data below
DEADLINE_S = 180.0


def job_examples() -> list[tuple[str, str]]:
    """(``page:line``, code) of every python block not marked as a fragment or a plugin example."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in _BLOCK.finditer(text):
            before = [line for line in text[: m.start()].splitlines() if line.strip()]
            if before and _SKIP.match(before[-1].strip()):
                continue
            line = text[: m.start()].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", m.group(1)))
    return found


# -- the input ------------------------------------------------------------------------------------------
def _orders() -> list[dict[str, Any]]:
    rows = []
    for i in range(60):  # 5 minutes of orders, in event-time order; some with amount <= 0
        amount = -1.0 if i % 7 == 3 else float(i % 11) + 0.5
        rows.append(
            {"order_id": f"o-{i}", "user": f"u-{i % 4}", "country": ["de", "fr", "us"][i % 3],
             "amount": amount, "ts": T0 + i * 5_000}
        )  # fmt: skip
    # a last order 20 minutes on: the watermark passes every window before it
    rows.append({"order_id": "o-last", "user": "u-0", "country": "de", "amount": 1.0, "ts": T0 + 1_200_000})
    return rows


def _clicks() -> list[dict[str, Any]]:
    # clicks of one session are 310 s apart, so a view pairs with one click at most, whatever the bounds
    rows = [{"click_id": f"c-{i}", "session": f"s-{i % 10}", "ts": T0 + i * 31_000} for i in range(30)]
    return rows + rows[:10]  # the first ten again, later: duplicates


def _views() -> list[dict[str, Any]]:
    # every other click is followed by a view of its session exactly 10 s later: inside between=("10 s",
    # "1 min") whichever way the bounds are read (the view 10 s to 1 min after the click, or the click
    # from 10 s before the view to 1 min after it); then views hours later, which pair with nothing
    rows = [
        {"session": f"s-{i % 10}", "page": f"p-{i}", "ts": T0 + i * 31_000 + 10_000} for i in range(0, 30, 2)
    ]
    return rows + [{"session": f"s-{k}", "page": "late-visit", "ts": T0 + 3 * 3_600_000} for k in range(10)]


INPUT = {"orders": _orders(), "clicks": _clicks(), "views": _views()}


# -- the judges: each example's output, computed from the input ------------------------------------------
def _readme_orders() -> dict[str, list[dict[str, Any]]]:
    return {"s3://bucket/orders": [r for r in INPUT["orders"] if r["amount"] > 0]}


def _orders_per_minute() -> dict[str, list[dict[str, Any]]]:
    windows: dict[tuple[str, int], list[float]] = {}
    last = max(r["ts"] for r in INPUT["orders"])
    for r in INPUT["orders"]:
        start = r["ts"] - r["ts"] % 60_000
        if start + 60_000 <= last - 5_000:  # the watermark (5 s behind the newest) passed the window's end
            windows.setdefault((r["user"], start), []).append(r["amount"])
    totals = [
        {"user": u, "window_start": s, "window_end": s + 60_000, "count": len(a), "sum_amount": sum(a),
         "max_amount": max(a)}
        for (u, s), a in windows.items()
    ]  # fmt: skip
    return {"./out/totals": totals}


def _clicks_with_views() -> dict[str, list[dict[str, Any]]]:
    first: dict[str, dict[str, Any]] = {}
    for c in INPUT["clicks"]:
        first.setdefault(c["click_id"], c)
    pairs = [
        {**c, "page": v["page"], "ts_right": v["ts"]}
        for c in first.values()
        for v in INPUT["views"]
        if v["session"] == c["session"] and v["ts"] - c["ts"] == 10_000
    ]
    return {"./out/clicks": list(first.values()), "./out/pairs": pairs}


#: pipeline name (as the example names it) -> its expected output per sink path (as the example names it)
JUDGES: dict[str, Callable[[], dict[str, list[dict[str, Any]]]]] = {
    "orders-to-parquet": _readme_orders,
    "orders-per-minute": _orders_per_minute,
    "clicks-with-views": _clicks_with_views,
}


# -- running -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def docs_broker() -> Iterator[TansuBroker]:
    """A broker of this module's own: the examples' topic names (``orders``) are plain words."""
    with TansuBroker() as broker:
        for topic, rows in INPUT.items():
            broker.create_topic(topic, partitions=1)
            broker.produce(topic, [json.dumps(r).encode() for r in rows], partition=0)
        yield broker


@dataclass
class Outputs:
    cwd: Path
    s3: MotoS3

    def read(self, path: str, columns: list[str]) -> list[tuple[Any, ...]] | None:
        """The committed rows at ``path`` (a reader's view: hidden files skipped), None if none yet."""
        if path.startswith("s3://"):
            location, fs = path.removeprefix("s3://"), self.s3.arrow_fs()
        else:
            location, fs = str(self.cwd / path), None
        try:
            dataset = ds.dataset(location, format="parquet", partitioning="hive", filesystem=fs)
            table = dataset.to_table()
        except (FileNotFoundError, OSError, pa.ArrowInvalid):
            return None
        if table.num_rows == 0 or not set(columns) <= set(table.column_names):
            return None
        return _rows(table.select(columns).to_pylist(), columns)


def _rows(rows: list[dict[str, Any]], columns: list[str]) -> list[tuple[Any, ...]]:
    def value(v: Any) -> Any:
        return round(v, 6) if isinstance(v, float) else str(v) if not isinstance(v, int | str) else v

    return sorted((tuple(value(r[c]) for c in columns) for r in rows), key=repr)


def _example_id(case: tuple[str, str]) -> str:
    return case[0]


@pytest.mark.kafka
@pytest.mark.parametrize("case", job_examples(), ids=_example_id)
def test_docs_job_example_runs_as_written(
    case: tuple[str, str], docs_broker: TansuBroker, moto_s3: MotoS3, tmp_path: Path
) -> None:
    where, code = case
    name = re.search(r"""Pipeline\(\s*["']([\w.-]+)["']""", code)
    assert name, f"{where}: a job example must make a Pipeline (or mark the block <!-- fragment -->)"
    assert name[1] in JUDGES, f"{where}: no judge for the pipeline {name[1]!r}: add one to {__file__}"
    expected = JUDGES[name[1]]()
    for address in BROKERS:
        code = code.replace(address, docs_broker.bootstrap)
    for bucket in sorted(set(re.findall(r"s3://([\w.-]+)/", code))):
        s3 = moto_s3.client()
        if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
            s3.create_bucket(Bucket=bucket)
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
    (tmp_path / "job.py").write_text(code)
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": moto_s3.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    cmd = [sys.executable, "-m", "sluice.cli", "run", "job.py", "--runtime", "local", "--progress-interval", "2"]
    outputs = Outputs(tmp_path, moto_s3)
    wanted = {path: _rows(rows, list(rows[0])) for path, rows in expected.items()}
    with (tmp_path / "stdout").open("w") as out, (tmp_path / "stderr").open("w") as err:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=err, text=True)
        try:
            deadline = time.monotonic() + DEADLINE_S
            seen: dict[str, Any] = {}
            while proc.poll() is None and time.monotonic() < deadline:
                seen = {p: outputs.read(p, list(expected[p][0])) for p in expected}
                if seen == wanted:
                    break
                time.sleep(0.5)
            log = (tmp_path / "stderr").read_text()
            assert proc.poll() is None, f"{where}: the job ended by itself:\n{log[-3000:]}"
            assert seen == wanted, f"{where}: output after {DEADLINE_S:.0f} s: {seen}\nwanted {wanted}\n{log[-3000:]}"
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log, stdout = (tmp_path / "stderr").read_text(), (tmp_path / "stdout").read_text()
    assert rc == 0, f"{where}: exit status {rc}\n{stdout}\n{log[-3000:]}"
    assert "control endpoint and dashboard at http://127.0.0.1:" in log, f"{where}: not run by sluice run\n{log}"
    assert re.search(r"read \d+", log), f"{where}: no progress lines\n{log}"
    assert "stopped at " in stdout and "resume with: sluice run job.py --runtime local --restore " in stdout, stdout
    after = {p: outputs.read(p, list(expected[p][0])) for p in expected}
    assert after == wanted, f"{where}: output changed after the stop: {after}"


def test_every_documented_job_example_is_run() -> None:
    """The examples this test must find (a page that loses its marker or its example fails here)."""
    pages = {where.split(":")[0] for where, _ in job_examples()}
    assert {"README.md", "docs/windows.md", "docs/dedup_joins.md"} <= pages, pages
