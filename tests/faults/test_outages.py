"""Outages of what a job talks to, through a fault proxy (tests/faults/proxy.py): S3 and the Kafka broker.

* S3 (file sink and checkpoints on ``s3://``, moto behind the proxy): an outage shorter than the storage
  retry budget is ridden out by retries (no restart); a longer one costs restarts, never the job (issue 21:
  a 15 s outage ended the job with 0 restarts, the cleanup of the pending checkpoint raising in place of the
  real failure). Output exactly once either way.
* the broker (a tansu advertising the proxy's address, so every connection goes through it): the source
  shows as stalled while it cannot reach the broker and resumes when it can; after the configured timeout it
  fails over to a restart instead of hanging. Output exactly once either way.

A scenario counts its fault as fired only if the proxy cut, refused or held a connection of the job while it
ran. The fast slice keeps outages short with short budgets; ``-m soak`` runs the issue's lengths.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pytest
from sluice import FixedDelayRestart, Pipeline
from sluice.connectors.kafka import KafkaSource

from tests.faults.beyond import (
    SINKS,
    UNHANDLED_THREAD_ERRORS_FAIL,
    Input,
    Output,
    check_exactly_once,
    completed,
    log_scenario,
    pipeline,
    wait_until,
)
from tests.faults.conftest import ProxiedBroker, ProxiedS3
from tests.faults.contract import checkpoint_config, kafka_options, missing, stall_shown
from tests.faults.proxy import FaultProxy

pytestmark = UNHANDLED_THREAD_ERRORS_FAIL
#: the broker outages here are a fault proxy's cuts, the broker behind it keeps running: no tansu quirk is
#: involved (plain records, no "latest", no transactions)
TANSU_PROXIED = pytest.mark.tansu("outages are a fault proxy's cuts in front of a broker that keeps running; plain records")

SCHEMA = pa.schema([("id", pa.int64()), ("p", pa.int64()), ("ts", pa.int64())])


# -- S3 ---------------------------------------------------------------------------------------------------
def s3_outage(
    s3: ProxiedS3,
    caplog: pytest.LogCaptureFixture,
    local: Path,
    sink: str,
    name: str,
    outage_s: float,
    budget_s: float,
    delay_s: float,
    timeout_s: float = 600.0,
) -> None:
    """Cut S3 for ``outage_s`` once the job completed two checkpoints; the storage retries for ``budget_s``,
    a checkpoint expires after ``timeout_s`` (the job fails over then: no tolerated checkpoint failures).

    An outage shorter than half the budget must cost no restart. A longer one may cost restarts, never the
    job; it must show that it outlasted the retries (a restart, a failed checkpoint or a logged storage
    failure), or the scenario did not test what it says."""
    caplog.set_level(logging.WARNING, logger="sluice")
    inp = Input(per_split=1000, rate=300.0)
    out = s3.output(sink, str(local))
    cc = checkpoint_config(
        interval=0.2,
        storage=f"{out.root}/chk",
        storage_options=s3.options(),
        storage_retry_timeout=budget_s,
        timeout=timeout_s,
    )
    p = pipeline(name, inp, out, cc, FixedDelayRestart(attempts=10, delay=delay_s))
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    wait_until(lambda: completed(client) >= 2, "two checkpoints before the outage", client)
    before = s3.proxy.outage_for(outage_s, "reject")  # counted: a pool may hold no open connection then
    wait_until(lambda: s3.proxy.mode == "pass", "the outage to end")
    hit = s3.proxy.stats.since(before)
    fired = hit.hit > 0  # the job ran when the outage began: a connection it cut or refused was the job's
    error: BaseException | None = None
    try:
        result = client.wait(300)
    except BaseException as exc:  # the job failed for good: the scenario fails below, naming it
        error, result = exc, None
    got = out.ids()
    log_scenario("s3-outage", name, sink, fired, got, inp.ids)
    label = f"{name}: {outage_s} s S3 outage, retry budget {budget_s} s ({hit})"
    assert fired, f"{label}: the outage hit no connection of the job"
    assert error is None and result is not None, (
        f"{label}: the job failed instead of restarting: {type(error).__name__}: {error}{missing()}"
    )
    assert result.status == "finished", f"{label}: {result.status}"
    failed = [c.checkpoint_id for c in result.checkpoints if c.status == "failed"]
    if outage_s < budget_s / 2:
        assert result.attempts == 1, f"{label}: retries did not ride it out: {result.failures}{missing()}"
    else:
        logged = [r.getMessage() for r in caplog.records if r.name.startswith("sluice") and _storage_failure(r)]
        assert result.attempts > 1 or failed or logged, (
            f"{label}: nothing shows the outage outlasted the retries (no restart, failed checkpoint or "
            f"logged storage failure){missing()}"
        )
    check_exactly_once(label, got, inp.ids)
    if sink != "files":
        check_exactly_once(f"{label} (read by another engine)", out.ids_independently(), inp.ids)


def _storage_failure(r: logging.LogRecord) -> bool:
    text = r.getMessage() + (f" {r.exc_info[1]!r}" if r.exc_info and r.exc_info[1] else "")
    return r.levelno >= logging.WARNING and ("S3" in text or "StorageError" in text or "storage" in text)


@pytest.mark.faults
@pytest.mark.s3
def test_short_s3_outage_is_ridden_out_by_retries(
    s3_proxy: ProxiedS3, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    s3_outage(s3_proxy, caplog, tmp_path, "files", "s3-short", outage_s=0.5, budget_s=5.0, delay_s=0.2)


@pytest.mark.faults
@pytest.mark.s3
@pytest.mark.parametrize("sink", SINKS)
def test_s3_outage_longer_than_the_retries_costs_restarts_not_the_job(
    s3_proxy: ProxiedS3, caplog: pytest.LogCaptureFixture, tmp_path: Path, sink: str
) -> None:
    s3_outage(
        s3_proxy, caplog, tmp_path, sink, f"s3-long-{sink}", outage_s=4.0, budget_s=1.0, delay_s=0.5, timeout_s=1.5
    )


@pytest.mark.soak
@pytest.mark.s3
@pytest.mark.parametrize("sink", SINKS)
def test_soak_fifteen_second_s3_outage(
    s3_proxy: ProxiedS3, caplog: pytest.LogCaptureFixture, tmp_path: Path, sink: str
) -> None:
    """The issue's case: cut 15 s, ``FixedDelayRestart(attempts=10, delay=5)``, default checkpoint timeout:
    the job may ride it out or restart, but it must finish with the input exactly once."""
    s3_outage(s3_proxy, caplog, tmp_path, sink, f"s3-15s-{sink}", outage_s=15.0, budget_s=5.0, delay_s=5.0)


# -- the broker -------------------------------------------------------------------------------------------
def produce(broker: ProxiedBroker, topic: str, start: int, n: int) -> list[int]:
    ids: list[int] = []
    for part in (0, 1):
        first = part * 100_000 + start
        values = [
            json.dumps({"id": i, "p": part, "ts": 1_700_000_000_000 + i}).encode() for i in range(first, first + n)
        ]
        broker.broker.produce(topic, values, partition=part)
        ids.extend(range(first, first + n))
    return ids


def broker_outage(
    broker: ProxiedBroker,
    out: Output,
    tmp: Path,
    fails_over: bool,
    hold: Callable[[Any, FaultProxy], None] | None = None,
    kind: Literal["cut", "blackhole"] = "cut",
) -> None:
    """The job reads the first half, the broker is cut (or blackholed: connections accepted, never answered)
    while it waits for the second (its stopping offsets lie beyond what exists), the fault ends, the second
    half is produced; the job must end with both halves."""
    topic = "outage"
    broker.broker.create_topic(topic, 2)
    ids = produce(broker, topic, 0, 600)
    stops = {(topic, p): 1000 for p in (0, 1)}  # 400 more per partition come after the outage
    timeout = 2.0 if fails_over else 120.0
    p = Pipeline(
        f"broker-{kind}-{out.kind}-{'failover' if fails_over else 'stall'}",
        parallelism=2,
        checkpoint=checkpoint_config(interval=0.1, storage=str(tmp / "chk")),
        restart=FixedDelayRestart(attempts=10, delay=0.2),
    )
    src = KafkaSource(
        broker.bootstrap, topic, format="json", schema=SCHEMA, batch_size=100, stopping_offsets=stops,
        request_timeout_s=5.0, **kafka_options(timeout),
    )  # fmt: skip
    p.source(src).sink(out.sink())
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    wait_until(lambda: out.committed(ids), "the first half committed", client, every=0.25)
    before = broker.proxy.stats.copy()
    broker.proxy.cut() if kind == "cut" else broker.proxy.blackhole()
    try:
        wait_until(lambda: broker.proxy.stats.since(before).hit > 0, f"the source to hit the {kind}", client)
        if hold is not None:
            hold(client, broker.proxy)
        elif fails_over:
            wait_until(
                lambda: client.monitor.attempts > 1, "a failover while the broker is away", client,
                explain=lambda: f"stalled shown: {stall_shown(client)}, {broker.proxy.stats.since(before)}",
            )  # fmt: skip
        else:
            # a refused connection is seen at once; an unanswered one only when the client's requests time
            # out (librdkafka's socket.timeout.ms is 60 s by default)
            limit = 30 if kind == "cut" else 120
            wait_until(lambda: stall_shown(client), "the source shown as stalled", client, limit)
    finally:
        broker.proxy.restore()
    fired = broker.proxy.stats.since(before).hit > 0
    ids += produce(broker, topic, 600, 400)
    error: BaseException | None = None
    try:
        result = client.wait(300)
    except BaseException as exc:
        error, result = exc, None
    got = out.ids()
    label = f"{p.name}: broker {kind} ({broker.proxy.stats.since(before)})"
    log_scenario("broker-outage", p.name, out.kind, fired, got, ids)
    assert fired, f"{label}: the {kind} hit no connection of the job"
    assert error is None and result is not None, f"{label}: the job failed: {error}{missing()}"
    assert result.status == "finished", f"{label}: {result.status}"
    if fails_over:
        assert result.attempts > 1, f"{label}: no failover{missing()}"
    check_exactly_once(label, got, ids)
    if out.kind != "files":
        check_exactly_once(f"{label} (read by another engine)", out.ids_independently(), ids)


@TANSU_PROXIED
@pytest.mark.faults
@pytest.mark.kafka
@pytest.mark.usefixtures("kafka_reader")  # on both readers
def test_broker_outage_shows_the_source_stalled_then_resumes(proxied_broker: ProxiedBroker, tmp_path: Path) -> None:
    broker_outage(proxied_broker, Output("files", str(tmp_path / "out")), tmp_path, fails_over=False)


@TANSU_PROXIED
@pytest.mark.soak
@pytest.mark.kafka
@pytest.mark.usefixtures("kafka_reader")  # on both readers
def test_soak_unanswering_broker_shows_the_source_stalled_then_resumes(
    proxied_broker: ProxiedBroker, tmp_path: Path
) -> None:
    """A blackholed broker (connections accepted, never answered: a partition, a hung broker)."""
    out = Output("files", str(tmp_path / "out"))
    broker_outage(proxied_broker, out, tmp_path, fails_over=False, kind="blackhole")


@TANSU_PROXIED
@pytest.mark.faults
@pytest.mark.kafka
@pytest.mark.usefixtures("kafka_reader")  # on both readers
@pytest.mark.parametrize("sink", SINKS)
def test_broker_outage_longer_than_the_timeout_fails_over(
    proxied_broker: ProxiedBroker, tmp_path: Path, sink: str
) -> None:
    broker_outage(proxied_broker, Output(sink, str(tmp_path / "out")), tmp_path, fails_over=True)


@TANSU_PROXIED
@pytest.mark.soak
@pytest.mark.kafka
@pytest.mark.usefixtures("kafka_reader")  # on both readers
@pytest.mark.parametrize("sink", SINKS)
def test_soak_eighteen_second_broker_outage(proxied_broker: ProxiedBroker, tmp_path: Path, sink: str) -> None:
    """The issue's case: the broker away for 18 s; stalled shown, failed over, output exactly once."""

    def hold(client: Any, proxy: FaultProxy) -> None:
        wait_until(lambda: stall_shown(client), "the source shown as stalled", client, 30)
        time.sleep(18)  # the outage's length is the fault's parameter, not a wait for a condition

    broker_outage(proxied_broker, Output(sink, str(tmp_path / "out")), tmp_path, fails_over=True, hold=hold)
