"""The jobs benchmarks/peers.py runs, one process each: ``python _peers_jobs.py '<json config>'``, with the
python of the engine's venv (sluice: the project's; the peers: benchmarks/_peers_env.py's).

Every job reads the input topic from its earliest offset and runs until benchmarks/peers.py stops it, once
its output holds every record (all engines stream the same way; none is told where the input ends). The
cases: ``parquet`` (the records into Parquet files, exactly once where the engine offers it), ``window``
(a tumbling one-minute count, sum and max of ``amount`` per ``user`` by event time ``ts``, a watermark
``delay_ms`` behind, into Parquet) and ``kafka`` (the records into a Kafka topic, JSON values keyed by
``user``). Only the standard library is imported at the top: each engine's venv has only its own packages.

Config keys: engine (sluice-local, sluice-spark, flink, spark, quix), case, bootstrap, topic, out (a
folder), out_topic, group, jars (list), parallelism, interval_s (checkpoint interval), delay_ms, window_ms,
replicas (Quix's processes).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

SCHEMA_SQL = "`user` BIGINT, amount DOUBLE, ts BIGINT"


def sluice_job(cfg: dict[str, Any]) -> None:
    """sluice: KafkaSource -> FileSink / window -> FileSink / KafkaSink, exactly-once checkpoints."""
    import pyarrow as pa
    from sluice import NoRestart, Pipeline, windows
    from sluice.connectors.kafka import KafkaSource
    from sluice.sinks.files import FileSink
    from sluice.sinks.kafka import KafkaSink
    from sluice.windows import Tumbling

    schema = pa.schema([("user", pa.int64()), ("amount", pa.float64()), ("ts", pa.int64())])
    case, out = cfg["case"], Path(cfg["out"])
    p = Pipeline(cfg["group"], parallelism=cfg["parallelism"], restart=NoRestart(),
                 checkpoint={"interval": cfg["interval_s"], "storage": str(out / "chk"), "mode": "exactly_once"})  # fmt: skip
    window = case == "window"
    src = KafkaSource(cfg["bootstrap"], cfg["topic"], format="json", schema=schema, batch_size=10_000,
                      group_id=cfg["group"], event_time="ts" if window else None,
                      max_out_of_orderness_ms=cfg["delay_ms"] if window else 0)  # fmt: skip
    s = p.source(src)
    if window:
        s = (s.key_by("user").window(Tumbling(cfg["window_ms"] / 1000), time="ts")
             .aggregate(windows.count(), windows.sum("amount"), windows.max("amount")))  # fmt: skip
    if case == "kafka":
        s.sink(KafkaSink(cfg["bootstrap"], cfg["out_topic"], delivery="exactly_once", key_columns="user", key_format="json"))
    else:
        s.sink(FileSink(str(out / "parquet"), format="parquet", compression="snappy"))
    p.run(runtime="spark" if cfg["engine"] == "sluice-spark" else "local", restore="none")


def flink_job(cfg: dict[str, Any]) -> None:
    """Apache Flink SQL (PyFlink, no Python functions) on its local mini-cluster: the Kafka SQL source, the
    filesystem sink (Parquet) or the Kafka sink (exactly-once), checkpoints every ``interval_s``."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    case, out = cfg["case"], Path(cfg["out"])
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    for k, v in {
        "pipeline.jars": ";".join(f"file://{j}" for j in cfg["jars"]),
        # one subtask per core, as sluice: 4 partitions, 2 per source subtask; the source-to-sink chain
        # (one thread per subtask) keeps both cores busy, and 1 would leave one idle between the broker's
        # fetches (docs/peers.md, "Configuration")
        "parallelism.default": str(cfg["parallelism"]),
        "pipeline.object-reuse": "true",  # Flink's tuning advice where no function keeps a record
        "execution.checkpointing.interval": f"{int(cfg['interval_s'] * 1000)}ms",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.dir": f"file://{out / 'chk'}",
        "state.backend.type": "hashmap",  # state on the heap, as sluice's hashmap backend
        # the window TVF aggregates in mini-batches in managed memory whatever table.exec.mini-batch.* says,
        # and AUTO plans it in two phases (local, then global): Flink's "Performance Tuning" page
        "table.optimizer.agg-phase-strategy": "AUTO",
        "table.local-time-zone": "UTC",
    }.items():
        conf.set(k, v)
    watermark = ""
    if case == "window":
        watermark = f", rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '{cfg['delay_ms'] // 1000}' SECOND"
    env.execute_sql(f"""CREATE TABLE src ({SCHEMA_SQL}{watermark}) WITH (
        'connector' = 'kafka', 'topic' = '{cfg["topic"]}', 'properties.bootstrap.servers' = '{cfg["bootstrap"]}',
        'properties.group.id' = '{cfg["group"]}', 'scan.startup.mode' = 'earliest-offset', 'format' = 'json')""")
    if case == "kafka":
        env.execute_sql(f"""CREATE TABLE dst ({SCHEMA_SQL}) WITH (
            'connector' = 'kafka', 'topic' = '{cfg["out_topic"]}', 'properties.bootstrap.servers' = '{cfg["bootstrap"]}',
            'format' = 'json', 'key.format' = 'json', 'key.fields' = 'user', 'value.fields-include' = 'ALL',
            'sink.delivery-guarantee' = 'exactly-once', 'sink.transactional-id-prefix' = '{cfg["group"]}',
            'properties.transaction.timeout.ms' = '60000',
            'properties.batch.size' = '1048576', 'properties.linger.ms' = '20')""")  # sluice's KafkaSink batching
        query = "INSERT INTO dst SELECT `user`, amount, ts FROM src"
    elif case == "window":
        env.execute_sql(f"""CREATE TABLE dst (`user` BIGINT, window_start TIMESTAMP(3), `count` BIGINT,
            sum_amount DOUBLE, max_amount DOUBLE) WITH (
            'connector' = 'filesystem', 'path' = 'file://{out / "parquet"}', 'format' = 'parquet')""")
        query = f"""INSERT INTO dst SELECT `user`, window_start, COUNT(*), SUM(amount), MAX(amount)
            FROM TABLE(TUMBLE(TABLE src, DESCRIPTOR(rt), INTERVAL '{cfg["window_ms"] // 1000}' SECOND))
            GROUP BY `user`, window_start, window_end"""
    else:
        env.execute_sql(f"""CREATE TABLE dst ({SCHEMA_SQL}) WITH (
            'connector' = 'filesystem', 'path' = 'file://{out / "parquet"}', 'format' = 'parquet')""")
        query = "INSERT INTO dst SELECT `user`, amount, ts FROM src"
    env.execute_sql(query).wait()


def spark_job(cfg: dict[str, Any]) -> None:
    """Spark Structured Streaming: the built-in Kafka source, the Parquet file sink (or the Kafka sink) with
    a checkpoint location, the default trigger (the next micro-batch as soon as the last one ended)."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    case, out = cfg["case"], Path(cfg["out"])
    spark = (
        SparkSession.builder.master(f"local[{cfg['parallelism']}]")
        .config("spark.jars", ",".join(cfg["jars"]))
        .config("spark.sql.shuffle.partitions", str(cfg["parallelism"]))  # Spark's tuning guide: ~ the cores
        .config("spark.driver.memory", "2g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    schema = T.StructType([T.StructField("user", T.LongType()), T.StructField("amount", T.DoubleType()),
                           T.StructField("ts", T.LongType())])  # fmt: skip
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", cfg["bootstrap"])
          .option("subscribe", cfg["topic"]).option("startingOffsets", "earliest").load()
          .select(F.from_json(F.col("value").cast("string"), schema).alias("v")).select("v.*"))  # fmt: skip
    if case == "window":
        df = (df.withColumn("rt", F.timestamp_millis("ts")).withWatermark("rt", f"{cfg['delay_ms'] // 1000} seconds")
              .groupBy(F.window("rt", f"{cfg['window_ms'] // 1000} seconds"), "user")
              .agg(F.count("*").alias("count"), F.sum("amount").alias("sum_amount"), F.max("amount").alias("max_amount"))
              .select("user", F.col("window.start").alias("window_start"), "count", "sum_amount", "max_amount"))  # fmt: skip
    writer = df.writeStream.option("checkpointLocation", str(out / "chk"))
    if case == "kafka":
        kv = df.select(F.to_json(F.struct("user")).alias("key"), F.to_json(F.struct("user", "amount", "ts")).alias("value"))
        # asynchronous progress tracking: the offset and commit logs written beside the micro-batches, every
        # interval_s, not between them (Spark's "Performance Tips": Kafka sink only; at least once either way)
        writer = (kv.writeStream.option("checkpointLocation", str(out / "chk")).format("kafka")
                  .option("kafka.bootstrap.servers", cfg["bootstrap"]).option("topic", cfg["out_topic"])
                  .option("asyncProgressTrackingEnabled", "true")
                  .option("asyncProgressTrackingCheckpointIntervalMs", str(int(cfg["interval_s"] * 1000))))  # fmt: skip
    else:
        writer = writer.format("parquet").option("path", str(out / "parquet")).outputMode("append")
    writer.start().awaitTermination()


def quix_job(cfg: dict[str, Any]) -> None:
    """Quix Streams, as its docs scale it: ``replicas`` processes of one application in one consumer group
    (it runs one thread per process), each with its consumer, ``tumbling_window(...).agg(...).final()`` for
    the window, and its local Parquet sink; a checkpoint (offsets committed, sink flushed, state changelog)
    every ``interval_s``."""
    import multiprocessing

    out = Path(cfg["out"])
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(out)  # its sink takes a folder name relative to the working directory
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_quix_replica, args=(cfg, i)) for i in range(cfg.get("replicas", 1))]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()


def _quix_replica(cfg: dict[str, Any], replica: int) -> None:
    from quixstreams import Application
    from quixstreams.dataframe.windows import Count, Max, Sum
    from quixstreams.sinks.community.file.local import LocalFileSink

    app = Application(broker_address=cfg["bootstrap"], consumer_group=cfg["group"], auto_offset_reset="earliest",
                      commit_interval=cfg["interval_s"], state_dir=str(Path(cfg["out"]) / f"state-{replica}"),
                      loglevel="WARNING")  # fmt: skip
    # keys stay bytes (its default): its Parquet sink writes a bytes key as text, any other as the repr of
    # its own item object
    topic = app.topic(cfg["topic"], key_deserializer="bytes", value_deserializer="json",
                      timestamp_extractor=lambda v, h, ts, tt: v["ts"])  # fmt: skip
    sdf = app.dataframe(topic)
    if cfg["case"] == "window":
        sdf = (sdf.tumbling_window(duration_ms=cfg["window_ms"], grace_ms=cfg["delay_ms"])
               .agg(count=Count(), sum_amount=Sum("amount"), max_amount=Max("amount"))
               .final(closing_strategy="partition"))  # fmt: skip
    sdf.sink(LocalFileSink(directory="parquet", format="parquet"))
    app.run()


JOBS = {"sluice-local": sluice_job, "sluice-spark": sluice_job, "flink": flink_job, "spark": spark_job, "quix": quix_job}

if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    JOBS[config["engine"]](config)
