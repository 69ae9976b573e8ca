"""benchmarks/peers.py's judges: what its watcher counts as visible, the data that closes every window, the
process-tree figures and the cached Maven classpath of the peers' jars."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from tests.apache_kafka import ApacheKafkaBroker
from tests.apache_kafka_jars import JarsUnavailableError, maven_classpath

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _common  # type: ignore[import-not-found]
import _peers_data as peers_data  # type: ignore[import-not-found]
import peers  # type: ignore[import-not-found]  # noqa: F401 (it imports)
from _peers_watch import ParquetWatch, run_job  # type: ignore[import-not-found]


def _parquet(path: Path, rows: int) -> Path:
    pq.write_table(pa.table({"x": list(range(rows))}), path)
    return path


def test_the_watcher_counts_what_a_reader_sees(tmp_path: Path) -> None:
    out = tmp_path / "files"
    out.mkdir()
    _parquet(out / "part-0", 3)
    _parquet(out / ".part-1.inprogress", 5)  # not committed yet (sluice, Flink)
    (out / "_SUCCESS").write_text("")
    whole = _parquet(tmp_path / "whole.parquet", 7).read_bytes()
    (out / "quix.parquet").write_bytes(whole[: len(whole) // 2])  # being written in place (Quix)
    watch = ParquetWatch(out)
    assert watch.poll() == 3
    (out / "quix.parquet").write_bytes(whole)
    assert watch.poll() == 10 and set(watch.files) == {str(out / "part-0"), str(out / "quix.parquet")}

    spark = tmp_path / "spark"
    (spark / "_spark_metadata").mkdir(parents=True)
    a, b = _parquet(spark / "part-a.parquet", 2), _parquet(spark / "part-b.parquet", 4)
    log = [json.dumps({"path": f"file://{a}", "action": "add"})]
    (spark / "_spark_metadata" / "0").write_text("\n".join(["v1", *log]))
    (spark / "_spark_metadata" / ".1.tmp").write_text("v1\n" + json.dumps({"path": f"file://{b}", "action": "add"}))
    watch = ParquetWatch(spark, "spark")
    assert watch.poll() == 2  # part-b is written but not committed by the log
    (spark / "_spark_metadata" / "1").write_text("v1\n" + json.dumps({"path": f"file://{b}", "action": "add"}))
    assert watch.poll() == 6


def test_a_job_is_timed_at_the_split_and_goes_on_until_every_record(tmp_path: Path) -> None:
    """--quick times a job on its first input, then feeds the same job its latency phase: the figures at the
    split are the timed run's, the job's later work is not in them."""
    folder, go = tmp_path / "job" / "parquet", tmp_path / "go"
    job = tmp_path / "job.py"
    job.write_text(f"""import pathlib, time
import pyarrow as pa, pyarrow.parquet as pq
folder = pathlib.Path({str(folder)!r})
folder.mkdir(parents=True)
pq.write_table(pa.table({{"x": [1, 2, 3]}}), folder / "a.parquet")
while not pathlib.Path({str(go)!r}).exists():
    time.sleep(0.02)
t = time.process_time()
while time.process_time() - t < 0.5:
    pass
pq.write_table(pa.table({{"x": [4, 5]}}), folder / "b.parquet")
time.sleep(120)
""")
    python = tmp_path / "python"  # run_job starts `python _peers_jobs.py <config>`: this one runs job.py
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {job}\n")
    python.chmod(0o755)
    cfg = {"engine": "fake", "case": "parquet", "out": str(tmp_path / "job")}
    run = run_job(str(python), cfg, ParquetWatch(folder), 5, 120, seen=lambda n: go.touch() if n >= 3 else None, split=3)
    assert run.split is not None
    assert run.split.wall < run.wall and run.cpu - run.split.cpu >= 0.4  # the burn after the split is not in it
    assert run.split.first_visible == run.first_visible


def test_the_sentinels_close_every_window_and_stay_out_of_the_reference() -> None:
    table = peers_data.records(1_000, 10, 2)
    data, sentinels = table.slice(0, 1_000), table.slice(1_000)
    assert sentinels.num_rows == peers_data.PARTITIONS
    assert sorted(u % peers_data.PARTITIONS for u in sentinels.column("user").to_pylist()) == list(range(peers_data.PARTITIONS))
    assert not set(sentinels.column("user").to_pylist()) & set(data.column("user").to_pylist())
    last = pc.max(data.column("ts")).as_py()
    assert pc.min(sentinels.column("ts")).as_py() > last + peers_data.WINDOW_MS + peers_data.DELAY_MS  # past every window
    ref = peers_data.reference_windows(table)
    assert pc.sum(ref.column("count")).as_py() == 1_000  # the sentinels' windows are not expected
    assert ref.num_rows == len({(u, t // peers_data.WINDOW_MS) for u, t in zip(*(data.column(c).to_pylist() for c in ("user", "ts")), strict=True)})
    got = ref.slice(1)
    with pytest.raises(RuntimeError, match="window rows differ"):
        peers_data.check("x", "window", got, table, ref)
    with pytest.raises(RuntimeError, match="differs from the input"):
        peers_data.check("x", "parquet", data.slice(1), data, None)
    assert peers_data.check("x", "parquet", pa.concat_tables([data, data.slice(0, 2)]), data, None) == {"duplicates": 2}


def test_process_tree_cpu_and_memory_include_the_children() -> None:
    burn = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass\nprint('done', flush=True)\ntime.sleep(30)"
    parent = subprocess.Popen(["sh", "-c", f"{sys.executable} -c \"{burn}\"; :"], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "done"
        pids = _common.tree_pids(parent.pid)
        assert parent.pid in pids and len(pids) == 2  # sh and its python child
        assert _common.tree_cpu_seconds(parent.pid) >= 0.25
        assert _common.tree_rss_bytes(parent.pid) > _common.tree_rss_bytes(pids[-1]) > 0
    finally:
        for pid in _common.tree_pids(parent.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        parent.wait()


def test_a_cached_classpath_serves_only_the_pom_it_was_resolved_from(tmp_path: Path) -> None:
    jar = tmp_path / "a.jar"
    jar.write_bytes(b"")
    (tmp_path / "pom.xml").write_text("<project>one</project>")
    (tmp_path / "classpath.txt").write_text(str(jar))
    assert maven_classpath("x", "<project>one</project>", tmp_path, resolve=False) == str(jar)
    with pytest.raises(JarsUnavailableError, match="x's jars are not in"):
        maven_classpath("x", "<project>two</project>", tmp_path, resolve=False)
    jar.unlink()
    with pytest.raises(JarsUnavailableError, match="x's jars are not in"):
        maven_classpath("x", "<project>one</project>", tmp_path, resolve=False)


def test_every_engines_window_output_is_read_the_same_way() -> None:
    ref = pa.table({"user": [3, 5], "window_start": [60_000, 120_000], "count": [2, 1],
                    "sum_amount": [1.5, 2.0], "max_amount": [1.0, 2.0]})  # fmt: skip
    flink = ref.set_column(1, "window_start", pa.array([60_000, 120_000], pa.timestamp("ms")))
    quix = pa.table({"_key": ["3", "5"], "start": [60_000, 120_000], "end": [120_000, 180_000], "count": [2, 1],
                     "sum_amount": [1.5, 2.0], "max_amount": [1.0, 2.0]})  # fmt: skip
    spark = flink.cast(flink.schema.set(1, pa.field("window_start", pa.timestamp("us", "UTC"))))
    for engine, got in (("sluice-local", ref), ("flink", flink), ("spark", spark)):
        assert peers_data.normalized(engine, got, "window").equals(ref), engine
    assert peers_data.normalized("quix", quix, "window").equals(ref)
    rows = pa.table({"amount": [1.0], "ts": [7], "user": [2], "_key": ["2"]})
    want = pa.table({"user": [2], "amount": [1.0], "ts": [7]}, schema=peers_data.SCHEMA)
    assert peers_data.normalized("quix", rows, "parquet").equals(want)


@pytest.mark.apache_kafka
def test_the_input_is_produced_and_checked_in_event_time_order_per_partition(
    apache_kafka: ApacheKafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    """The window case's premise (no record is late for a watermark 10 s behind) is checked on the topic
    itself: the producer is idempotent (a retried batch of a plain one lands behind later batches: seen on a
    loaded machine, records a minute behind their partition's sentinel an hour ahead), and the input read back
    by a plain consumer must never go back in event time within a partition."""
    assert peers_data.PRODUCER_CONF["enable.idempotence"] is True
    table = peers_data.records(2_000, 10, 2)
    good = kafka_topic(peers_data.PARTITIONS)
    peers_data.produce(apache_kafka.bootstrap, good, table)
    assert peers_data.check_order(apache_kafka.bootstrap, good) == table.num_rows

    # what the retry did: the first batch of a partition written after the later ones (and its sentinel)
    rows = [r for r in table.to_pylist() if r["user"] % peers_data.PARTITIONS == 0]
    bad = kafka_topic(1)
    p = Producer({"bootstrap.servers": apache_kafka.bootstrap, "log_level": 0})
    for r in rows[100:] + rows[:100]:
        p.produce(bad, json.dumps(r).encode(), partition=0)
    assert p.flush(60) == 0
    with pytest.raises(RuntimeError, match=rf"{bad}\[0\] offset {len(rows) - 100}: ts \d+ is \d+ ms behind"):
        peers_data.check_order(apache_kafka.bootstrap, bad)
