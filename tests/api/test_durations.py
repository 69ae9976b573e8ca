"""One duration convention (docs/configuration.md, *Durations*): every option that takes a duration, in the
API and on the CLI, reads ``"1m"``, ``"30 s"``, ``"250ms"``, a ``timedelta`` and a bare number of seconds the
same way, through one parser (``sluice.durations``), and refuses anything else in one line naming the
option. (Before: windows read a bare number as milliseconds, ``Tumbling(60)`` being 60 ms; deduplicate and
the joins refused ``"1m"``; ``CheckpointConfig`` and ``Pipeline`` refused strings.)"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sluice import (
    CheckpointConfig,
    ConfigError,
    ExponentialBackoffRestart,
    FailureRateRestart,
    FixedDelayRestart,
    Pipeline,
)
from sluice.connectors.generator import GeneratorSource
from sluice.connectors.kafka import KafkaSource
from sluice.durations import to_ms, to_seconds
from sluice.sinks.files import FileSink
from sluice.sinks.kafka import KafkaSink
from sluice.state.config import StateBackendConfig, StateTtlConfig
from sluice.windows import Session, Sliding, Tumbling

MINUTE = ("1m", "1 min", "60 s", "60000ms", "1 minute", timedelta(minutes=1), 60, 60.0)


def stream() -> Any:
    p = Pipeline("durations", checkpoint=CheckpointConfig(storage="/nonexistent/chk"))
    return p, p.source(GeneratorSource(num_splits=1, records_per_split=10), name="src")


def node_config(p: Pipeline, name: str) -> dict[str, Any]:
    return next(n.state_config for n in p.graph.nodes.values() if n.name == name)  # type: ignore[return-value]


def dedup_within(value: Any) -> int:
    p, s = stream()
    s.deduplicate("key", within=value, event_time="ts", name="d")
    return int(node_config(p, "d")["within_ms"])


def interval_upper(value: Any) -> int:
    p, s = stream()
    s.interval_join(s.map_batches(lambda b: b, schema=s.schema, name="o"), on="key", between=(0, value), name="i")
    return int(node_config(p, "i")["upper_ms"])


def lateness(value: Any) -> int:
    _, s = stream()
    return int(s.key_by("key").window(Tumbling(1), time="ts", allowed_lateness=value).allowed_lateness)


#: (option, read it from a value, what a minute reads as)
OPTIONS: list[tuple[str, Callable[[Any], Any], Any]] = [
    ("Tumbling(size)", lambda v: Tumbling(v).size, 60_000),
    ("Sliding(size)", lambda v: Sliding(v, "30 s").size, 60_000),
    ("Session(gap)", lambda v: Session(v).gap, 60_000),
    ("window(allowed_lateness)", lateness, 60_000),
    ("deduplicate(within)", dedup_within, 60_000),
    ("interval_join(between)", interval_upper, 60_000),
    ("CheckpointConfig(interval)", lambda v: CheckpointConfig(interval=v).interval, 60.0),
    ("CheckpointConfig(timeout)", lambda v: CheckpointConfig(timeout=v).timeout, 60.0),
    ("CheckpointConfig(min_pause)", lambda v: CheckpointConfig(min_pause=v).min_pause, 60.0),
    ("CheckpointConfig(aligned_checkpoint_timeout)",
     lambda v: CheckpointConfig(aligned_checkpoint_timeout=v).aligned_checkpoint_timeout, 60.0),
    ("CheckpointConfig(storage_retry_timeout)",
     lambda v: CheckpointConfig(storage_retry_timeout=v).storage_retry_timeout, 60.0),
    ("FixedDelayRestart(delay)", lambda v: FixedDelayRestart(delay=v).delay, 60.0),
    ("ExponentialBackoffRestart(max_delay)", lambda v: ExponentialBackoffRestart(max_delay=v).max_delay, 60.0),
    ("FailureRateRestart(interval)", lambda v: FailureRateRestart(interval=v).interval, 60.0),
    ("Pipeline(task_cancellation_timeout)",
     lambda v: Pipeline("p", task_cancellation_timeout=v).task_cancellation_timeout, 60.0),
    ("StateTtlConfig(ttl)", lambda v: StateTtlConfig(ttl=v).ttl, 60.0),
    ("StateBackendConfig(changelog_materialize_interval)",
     lambda v: StateBackendConfig(changelog_materialize_interval=v).changelog_materialize_interval, 60.0),
    ("KafkaSource(idle_timeout_s)", lambda v: KafkaSource("h:1", "t", idle_timeout_s=v).options.idle_timeout_s, 60.0),
    ("KafkaSource(discovery_interval_s)",
     lambda v: KafkaSource("h:1", "t", discovery_interval_s=v).options.discovery_interval_s, 60.0),
    ("KafkaSink(transaction_timeout_s)",
     lambda v: KafkaSink("h:1", "t", transaction_timeout_s=v).options.transaction_timeout_s, 60.0),
    ("FileSink(rolling.rollover_interval)",
     lambda v: FileSink("/nonexistent/out", rolling={"rollover_interval": v}).options.rolling.rollover_interval, 60.0),
]  # fmt: skip


@pytest.mark.parametrize(("option", "read", "minute"), OPTIONS, ids=[o[0] for o in OPTIONS])
def test_every_duration_option_reads_a_minute_in_every_form(option: str, read: Callable[[Any], Any], minute: Any) -> None:
    """A bare number is seconds everywhere: ``Tumbling(60)`` is a minute, not 60 ms."""
    for value in MINUTE:
        assert read(value) == minute, (option, value)


@pytest.mark.parametrize(("option", "read", "minute"), OPTIONS, ids=[o[0] for o in OPTIONS])
@pytest.mark.parametrize("bad", ["soon", "60", True, [60]])
def test_anything_else_is_one_line_naming_the_option(option: str, read: Callable[[Any], Any], minute: Any, bad: Any) -> None:
    with pytest.raises(ConfigError) as err:
        read(bad)
    text = str(err.value)
    assert "\n" not in text, text
    assert "is not a duration: give a number of seconds" in text or "is a number in a string: give a unit" in text, text
    name = option.split("(")[1].rstrip(")").split(".")[-1]
    assert name in text, text


def test_the_options_named_in_a_unit_read_a_bare_number_in_it() -> None:
    """``idle_timeout_s=3`` is 3 s, ``max_out_of_orderness_ms=5000`` is 5 s: the name says the unit; the
    other forms mean what they mean everywhere."""
    src = KafkaSource("h:1", "t", idle_timeout_s=3, max_out_of_orderness_ms=5000, poll_timeout_ms="10ms")
    assert (src.options.idle_timeout_s, src.options.max_out_of_orderness_ms, src.options.poll_timeout_ms) == (3.0, 5000, 10)
    src = KafkaSource("h:1", "t", max_out_of_orderness_ms="5 s", request_timeout_s=timedelta(seconds=2))
    assert (src.options.max_out_of_orderness_ms, src.options.request_timeout_s) == (5000, 2.0)
    assert GeneratorSource(step_ms="1 s").options.step_ms == 1000


def test_signs_and_sizes() -> None:
    """Negative only where a duration may be (an interval join's bound), nothing under a millisecond where
    milliseconds are kept, no infinity."""
    assert to_ms("-10 s", "b", sign="any") == -10_000 and to_ms(timedelta(milliseconds=-5), "b", sign="any") == -5
    assert to_seconds("0.5 s", "x") == 0.5 and to_seconds(".25 h", "x") == 900.0
    cases = [
        (lambda: Tumbling("-1 min"), "Tumbling(size): must be a duration > 0 (got '-1 min')"),
        (lambda: Tumbling(0.0001), "Tumbling(size): 0.0001 is less than a millisecond"),
        (lambda: CheckpointConfig(timeout=float("inf")), "CheckpointConfig(timeout): must be a finite duration"),
        (lambda: CheckpointConfig(min_pause="-1 s"), "invalid CheckpointConfig: min_pause must be a duration >= 0"),
    ]
    for build, message in cases:
        with pytest.raises(ConfigError) as err:
            build()
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_cli_duration_flags_read_seconds_and_units() -> None:
    import click
    from click.testing import CliRunner
    from sluice.cli.params import Duration

    @click.command()
    @click.option("--timeout", type=Duration(), default=600.0)
    def show(timeout: float) -> None:
        click.echo(repr(timeout))

    runner = CliRunner()
    assert [runner.invoke(show, ["--timeout", v]).output.strip() for v in ("10 min", "600", "2m", "1.5 s")] == [
        "600.0", "600.0", "120.0", "1.5"
    ]
    bad = runner.invoke(show, ["--timeout", "soon"])
    assert bad.exit_code == 2 and "'soon' is not a duration" in bad.output
