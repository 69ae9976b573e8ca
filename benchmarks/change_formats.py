"""The change formats' decoders alone, against the plain formats on the same values, in one run.

Decodes one batch of ``--records`` Debezium update events of a 3-column table (keys and values, as a reader
gets them from the fetch thread) with ``debezium-json`` (without and with Kafka Connect's schema envelope)
and ``debezium-avro`` (the recorded schema registry of the tests), and the same values with ``json`` and
``avro`` (which decode no keys and make no change columns); keyed rows with ``upsert-json``. Each is the best
of ``--repeats`` runs with a fresh decoder; the machine is shared, so only same-run ratios mean something.

Usage: python benchmarks/change_formats.py [--records 10000] [--repeats 5]
Last line: RESULT {json}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from sluice.connectors.kafka import KafkaSource
from sluice.connectors.kafka.formats import Messages, make_decoder

from tests.connectors.kafka.change_events import DBZ_ENVELOPE, DBZ_KEY, connect_json, event, json_key
from tests.connectors.kafka.fakes import FakeMessage
from tests.connectors.kafka.registry_server import RecordedSchemaRegistry, avro_wire


def customer(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"name-{i}", "email": f"e{i}@example.org"}


def rate(pairs: list[tuple[bytes, bytes]], repeats: int, **options: Any) -> float:
    """Records per second decoding ``pairs`` (key, value) in one batch (best of ``repeats``)."""
    src = KafkaSource("localhost:9092", "t", **options)
    src.validate()
    msgs = Messages.of([FakeMessage("t", 0, i, v, k=k) for i, (k, v) in enumerate(pairs)])
    best = float("inf")
    for _ in range(repeats):
        decoder = make_decoder(src.options)
        t0 = time.perf_counter()
        d = decoder.decode_messages(msgs)
        best = min(best, time.perf_counter() - t0)
        assert d.batch is not None and d.batch.num_rows == len(pairs) and not d.bad, d.bad[:1]
    return round(len(pairs) / best)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    n, r = args.records, args.repeats
    plain = [(json_key(i), json.dumps(event("u", customer(i), customer(i))).encode()) for i in range(n)]
    wrapped = [(json_key(i, schema=True), connect_json(event("u", customer(i), customer(i)))) for i in range(n)]
    keyed = [(json.dumps({"id": i}).encode(), json.dumps(customer(i)).encode()) for i in range(n)]
    result: dict[str, Any] = {"records": n}
    result["json_rps"] = rate(plain, r, format="json")
    result["debezium_json_rps"] = rate(plain, r, format="debezium-json")
    result["debezium_json_envelope_rps"] = rate(wrapped, r, format="debezium-json")
    result["upsert_json_rps"] = rate(keyed, r, format="upsert-json")
    with RecordedSchemaRegistry() as reg:
        kid = reg.register("dbserver1.inventory.customers-key", DBZ_KEY)
        vid = reg.register("dbserver1.inventory.customers-value", DBZ_ENVELOPE)
        avro = [
            (avro_wire(kid, DBZ_KEY, {"id": i}), avro_wire(vid, DBZ_ENVELOPE, event("u", customer(i), customer(i))))
            for i in range(n)
        ]
        result["avro_rps"] = rate(avro, r, format="avro", schema_registry=reg.url)
        result["debezium_avro_rps"] = rate(avro, r, format="debezium-avro", schema_registry=reg.url)
    for k, v in result.items():
        print(f"{k}: {v}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
