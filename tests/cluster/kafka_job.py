"""The job the cluster tests submit: Kafka (JSON ``{"id", "p", "ts"}``) -> Parquet (FileSink), exactly once.

Usage: spark-submit ... kafka_job.py BOOTSTRAP TOPIC ENDS_JSON OUT_DIR [--delay S] [--who] [--rebalance]

``ENDS_JSON`` maps partition -> stopping offset: the job ends when it has read that far. Each batch
sleeps ``--delay`` seconds so that checkpoints interleave with the reads. ``--who`` logs, once per
subtask, which Python and which sluice the executor runs (the slot's log reaches the driver). The last
line on stdout is ``SLUICE_RESULT {json}`` (status, attempts, failures).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import pyarrow as pa
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.int64()), ("ts", pa.int64())])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("ends")
    ap.add_argument("out")
    ap.add_argument("--delay", type=float, default=0.02)
    ap.add_argument("--who", action="store_true")
    ap.add_argument("--rebalance", action="store_true", help="send every record to another slot's sink")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("sluice").setLevel(logging.INFO)
    ends = {(args.topic, int(p)): int(off) for p, off in json.loads(args.ends).items()}
    delay, who = args.delay, args.who
    seen: list[bool] = []

    def pace(batch: pa.RecordBatch) -> pa.RecordBatch:
        if who and not seen:
            import sluice

            seen.append(True)
            logging.getLogger("sluice.user").warning(
                "executor python %s sluice %s", sys.executable, sluice.__file__
            )
        time.sleep(delay)
        return batch

    p = Pipeline(
        "cluster-kafka-parquet",
        parallelism=2,
        restart=FixedDelayRestart(attempts=6, delay=1.0),
        checkpoint=CheckpointConfig(interval=0.5, storage=f"{args.out}/chk"),
    )
    src = KafkaSource(
        args.bootstrap, args.topic, format="json", schema=SCHEMA, batch_size=50, stopping_offsets=ends
    )
    stream = p.source(src).map_batches(pace, name="pace")
    if args.rebalance:
        stream = stream.rebalance()
    stream.sink(FileSink(f"{args.out}/table", format="parquet"))
    result = p.run(runtime="spark")  # restore="latest": a resubmitted job resumes its checkpoints
    print(
        "SLUICE_RESULT "
        + json.dumps({"status": str(result.status), "attempts": result.attempts, "failures": result.failures}),
        flush=True,
    )


if __name__ == "__main__":
    main()
