"""One benchmark job alone, for a profiler to look at (not a benchmark: no rounds, no peer).

``--job kafka`` is ``kafka_ceiling.py``'s Kafka -> Parquet job at parallelism 1; ``stateless``, ``dedup``
and ``join`` are ``stateful_dedup_join.py``'s jobs (``--quick`` sizes). The broker (tansu) is a process of
its own and the input is produced before the job starts, so a sampling profiler attached to this process
(``py-spy record --native --idle`` or ``perf record``) sees the job and the producer only; the line
``PROFILE_START`` marks where the job begins. Run with ``SLUICE_KAFKA_READER=native|python``::

    py-spy record --native -r 200 -f raw -o /tmp/join.txt -- python benchmarks/profile_job.py --job join
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kafka_ceiling as kc  # type: ignore[import-not-found]
import stateful_dedup_join as sdj  # type: ignore[import-not-found]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", choices=["kafka", "stateless", "dedup", "join"], required=True)
    ap.add_argument("--messages", type=int, default=1_000_000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="profile-job-"))
    try:
        with kc.TansuBroker() as broker:
            if args.job == "kafka":
                broker.create_topic(kc.TOPIC, kc.PARTITIONS)
                kc.produce(broker.bootstrap, args.messages)
                ends = broker.end_offsets(kc.TOPIC, timeout=60)
                print(f"PROFILE_START pid={os.getpid()}", flush=True)
                t0, c0 = time.perf_counter(), time.process_time()
                kc.sluice_job(broker.bootstrap, args.messages, work / "job", ends, 1, True)
            else:
                n_dims = args.messages // 10
                events = sdj.event_table(args.messages, n_dims)
                ids, customers = events.column("id").to_pylist(), events.column("customer").to_pylist()
                for topic in ("events", "dims"):
                    broker.create_topic(topic, sdj.PARTITIONS)
                sdj.produce(broker.bootstrap, "events", args.messages,
                            lambda i: b'{"id":%d,"customer":%d,"amount":%d.5,"ts":%d}' % (ids[i], customers[i], i % 1000, sdj.T0 + i))  # fmt: skip
                sdj.produce(broker.bootstrap, "dims", n_dims,
                            lambda i: b'{"customer":%d,"tier":"tier-%d","region":"eu-%d","level":%d}' % (i, i % 5, i % 17, i))  # fmt: skip
                ends = {t: broker.end_offsets(t, timeout=60) for t in ("events", "dims")}
                print(f"PROFILE_START pid={os.getpid()}", flush=True)
                t0, c0 = time.perf_counter(), time.process_time()
                sdj.job(args.job, broker.bootstrap, ends, work / "job",
                        argparse.Namespace(parallelism=1, join_backend="hashmap"))  # fmt: skip
            cpu = time.process_time() - c0
            print(
                f"PROFILE_END {args.job}: {time.perf_counter() - t0:.1f} s wall, "
                f"{cpu / args.messages * 1e9:,.0f} ns CPU per record (this process)",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
