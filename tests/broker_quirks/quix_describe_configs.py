"""DescribeConfigs returns no entries, and Quix Streams' stateful dataframes need ``retention.ms``.

Apache Kafka: DescribeConfigs of a topic returns every topic config, defaults included
(``retention.ms`` = 604800000 unless set).
tansu: it returns 0 entries (see create_topics.py). Quix Streams (3.x) reads the source topic's
``retention.ms`` to configure the changelog topic of a stateful ``apply`` and fails with
``KeyError: 'retention.ms'`` before consuming anything.
Workaround (benchmarks/_state_job.py ``quix_on_tansu``): fill in Kafka's defaults of the configs
Quix reads when the broker returns none.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from _broker import NAMES, broker, parse
from confluent_kafka.admin import ConfigResource, ResourceType


def stateful_app(bootstrap: str, state_dir: str) -> str:
    from quixstreams import Application

    app = Application(broker_address=bootstrap, consumer_group="g", state_dir=state_dir, loglevel="ERROR")
    sdf = app.dataframe(app.topic("t", value_deserializer="bytes"))
    try:
        sdf.apply(lambda value, state: state.get("n", 0), stateful=True)
    except KeyError as exc:
        return f"KeyError {exc}"
    return "ok"


def main(kind: str) -> None:
    name = NAMES[kind]
    with broker(kind) as b:
        b.create_topic("t", 1)
        res = b.admin.describe_configs([ConfigResource(ResourceType.TOPIC, "t")])
        configs: dict[str, Any] = next(iter(res.values())).result(10)
        print(f"DescribeConfigs(topic t): Kafka returns every config (retention.ms=604800000), {name} {len(configs)} entries")
        with tempfile.TemporaryDirectory() as d:
            print(f"Quix Streams stateful apply on {name}: {stateful_app(b.bootstrap, d)}")
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
        from _state_job import quix_on_tansu  # type: ignore[import-not-found]

        quix_on_tansu()
        with tempfile.TemporaryDirectory() as d:
            print(f"... with quix_on_tansu() (Kafka's defaults filled in where none came): {stateful_app(b.bootstrap, d)}")


if __name__ == "__main__":
    main(parse(__doc__).broker)
