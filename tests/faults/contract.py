"""What the fault tier expects of sluice's API, in one place (issue 21): option names and refusal checks.

Some names were chosen on other branches while this tier was written; adjust them here only:

* ``allow_reprocessing`` (``Pipeline.run``/``start``, ``sluice run --allow-reprocessing``): branch i21-sinks;
* ``CheckpointConfig.storage_retry_timeout`` (seconds a storage call is retried): branch i21-ckpt;
* ``KafkaSource(broker_unavailable_timeout_s=...)``, ``KafkaSource(max_record_bytes=...)`` and the
  "stalled" sources of the status and metrics: branch i21-kafka.

A *pending* option (one this checkout does not have yet) is left out rather than passed: the scenario then
runs against the behaviour as it is and fails on what the issue asks for (a restart that never comes, a
refusal that is not made), not on an unknown keyword. :func:`missing` names what was left out, and every
scenario's failure message includes it.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from sluice import CheckpointConfig, JobClient
from sluice.connectors.kafka import KafkaSource

__all__ = [
    "ALLOW_REPROCESSING",
    "KAFKA_OUTAGE_TIMEOUT",
    "MAX_RECORD_BYTES",
    "OVER_LIMIT",
    "STORAGE_RETRY_TIMEOUT",
    "checkpoint_config",
    "kafka_options",
    "missing",
    "one_line",
    "run_options",
    "stall_shown",
]

#: the run option that lets a restore write again what a sink already holds
ALLOW_REPROCESSING = "allow_reprocessing"
#: the CheckpointConfig field bounding how long a storage call is retried
STORAGE_RETRY_TIMEOUT = "storage_retry_timeout"
#: the KafkaSource option after which a source that cannot reach its brokers fails over to a restart
KAFKA_OUTAGE_TIMEOUT = "broker_unavailable_timeout_s"
#: the KafkaSource option that sets the largest value decoded (Kafka's default message.max.bytes, 1 MiB)
MAX_RECORD_BYTES = "max_record_bytes"
#: what the error of a record over the maximum size says (besides its topic, partition and offset)
OVER_LIMIT = re.compile(r"(?i)max|limit|too large|larger than|exceeds")

_MISSING: set[str] = set()


def missing() -> str:
    """The pending options this checkout lacks (left out of the scenarios), for failure messages."""
    return f" [options this checkout lacks, left out: {sorted(_MISSING)}]" if _MISSING else ""


def checkpoint_config(**options: Any) -> CheckpointConfig:
    """A CheckpointConfig. Where this checkout lacks :data:`STORAGE_RETRY_TIMEOUT`, the shortest retry
    budget it has stands in for a short one: S3 clients that try each request once (``max_attempts=1``)."""
    if STORAGE_RETRY_TIMEOUT in options and STORAGE_RETRY_TIMEOUT not in CheckpointConfig.model_fields:
        _MISSING.add(f"CheckpointConfig.{STORAGE_RETRY_TIMEOUT}")
        options.pop(STORAGE_RETRY_TIMEOUT)
        if str(options.get("storage", "")).startswith("s3://"):
            options["storage_options"] = {**options.get("storage_options", {}), "max_attempts": 1}
    return CheckpointConfig(**options)


def kafka_options(outage_timeout_s: float | None = None, max_record_bytes: int | None = None) -> dict[str, Any]:
    """KafkaSource options: the broker-outage timeout (:data:`KAFKA_OUTAGE_TIMEOUT`) and the largest record
    (:data:`MAX_RECORD_BYTES`); each left out where this checkout lacks it."""
    params = inspect.signature(KafkaSource.__init__).parameters
    out: dict[str, Any] = {}
    if outage_timeout_s is not None:
        if KAFKA_OUTAGE_TIMEOUT in params:
            out[KAFKA_OUTAGE_TIMEOUT] = outage_timeout_s
        else:
            _MISSING.add(f"KafkaSource.{KAFKA_OUTAGE_TIMEOUT}")
    if max_record_bytes is not None:
        if MAX_RECORD_BYTES in params:
            out[MAX_RECORD_BYTES] = max_record_bytes
        else:
            _MISSING.add(f"KafkaSource.{MAX_RECORD_BYTES}")
    return out


def run_options(allow_reprocessing: bool) -> dict[str, Any]:
    """Options of ``Pipeline.run``: allow reprocessing (left out where this checkout lacks it)."""
    if not allow_reprocessing:
        return {}
    from sluice import Pipeline

    if ALLOW_REPROCESSING not in inspect.signature(Pipeline.start).parameters:
        _MISSING.add(f"Pipeline.start({ALLOW_REPROCESSING}=...)")
        return {}
    return {ALLOW_REPROCESSING: True}


def one_line(error: BaseException, *names: str) -> str:
    """Check that ``error`` is a clear refusal: a sluice error, one line, naming each of ``names``; returns
    its text."""
    from sluice.errors import SluiceError

    text = str(error)
    assert isinstance(error, SluiceError), f"not a sluice error but {type(error).__name__}: {text}{missing()}"
    assert "\n" not in text.strip(), f"the refusal is not one line:\n{text}"
    for name in names:
        assert name in text, f"the refusal does not name {name!r}: {text}"
    return text


def stall_shown(client: JobClient) -> bool:
    """Whether the job's status or metrics (what ``sluice status``, the progress line and the dashboard
    show) say a source is stalled: a field named ``*stalled*`` with a value (not None, empty or False)."""
    return any(_stalled(v) for v in (client.monitor.overview(), client.monitor.metrics()))


def _stalled(value: Any) -> bool:
    if isinstance(value, dict):
        return any((("stalled" in str(k).lower()) and bool(v)) or _stalled(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_stalled(v) for v in value)
    return False
