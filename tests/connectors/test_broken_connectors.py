"""Each deliberately broken connector (tests/connectors/broken.py) fails the kit's check of the contract it
breaks, with a message that starts with that contract's name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from sluice.sinks.testing import read_committed
from sluice.testing.conformance import (
    SINK_CHECKS,
    SOURCE_CHECKS,
    ConformanceError,
    SinkCase,
    SinkTarget,
    SourceCase,
)

from tests.connectors.broken import BROKEN_SINKS, BROKEN_SOURCES


@pytest.mark.parametrize("name", sorted(BROKEN_SOURCES))
def test_kit_fails_broken_source_naming_the_contract(name: str) -> None:
    make, check, contract = BROKEN_SOURCES[name]
    source = make()
    # a broken reader may never end: the harness gives up on a reader without progress after 0.3 s
    case = SourceCase(source, source.expected(), columns=["id"], stall_timeout_s=0.3)
    with pytest.raises(ConformanceError) as info:
        SOURCE_CHECKS[check](case)
    assert str(info.value).startswith(f"[source: {contract}]"), str(info.value)
    assert info.value.contract == contract


@pytest.mark.parametrize("name", sorted(BROKEN_SINKS))
def test_kit_fails_broken_sink_naming_the_contract(name: str, tmp_path: Path) -> None:
    make, check, contract = BROKEN_SINKS[name]
    dirs = iter(range(100))

    def target() -> SinkTarget:
        d = str(tmp_path / f"t{next(dirs)}")
        sink: Any = make(d)
        return SinkTarget(sink, lambda: read_committed(d), lambda: os.listdir(os.path.join(d, "pending")))

    with pytest.raises(ConformanceError) as info:
        SINK_CHECKS[check](SinkCase(target))
    assert str(info.value).startswith(f"[sink: {contract}]"), str(info.value)


def test_the_unbroken_generator_behind_the_broken_sources_passes_every_check() -> None:
    """The broken sources differ from a conforming one only in the part they break."""
    from tests.connectors.broken import _source

    source = _source()
    case = SourceCase(source, source.expected(), columns=["id"])
    for check in SOURCE_CHECKS.values():
        check(case)


def test_the_unbroken_sink_behind_the_broken_sinks_passes_every_check(tmp_path: Path) -> None:
    from tests.connectors.broken import _sink

    dirs = iter(range(100))

    def target() -> SinkTarget:
        d = str(tmp_path / f"t{next(dirs)}")
        return SinkTarget(
            _sink(d, global_commit=True),
            lambda: read_committed(d),
            lambda: os.listdir(os.path.join(d, "pending")),
        )

    for check in SINK_CHECKS.values():
        check(SinkCase(target))


def test_cases_refuse_what_the_kit_cannot_check() -> None:
    from sluice.connectors.generator import GeneratorSource
    from sluice.errors import ConfigError

    with pytest.raises(ConfigError, match="must be bounded"):
        SourceCase(GeneratorSource(records_per_split=None), [], columns=["id"])
    with pytest.raises(ConfigError, match="rounds must be an integer >= 3"):
        SinkCase(lambda: None, rounds=2)  # type: ignore[arg-type, return-value]


@pytest.mark.parametrize("name", ["reader snapshots an off-by-one position", "reader reads past its stopping position"])
def test_in_a_job_check_fails_broken_sources(name: str) -> None:
    make = BROKEN_SOURCES[name][0]
    source = make()
    with pytest.raises(ConformanceError, match=r"^\[source: exactly once in a job with a crash\]"):
        SOURCE_CHECKS["exactly_once_in_a_job"](SourceCase(source, source.expected(), columns=["id"]))


@pytest.mark.parametrize("name", ["committer not idempotent", "data visible before commit"])
def test_in_a_job_check_fails_broken_sinks(name: str, tmp_path: Path) -> None:
    make = BROKEN_SINKS[name][0]
    dirs = iter(range(100))

    def target() -> SinkTarget:
        d = str(tmp_path / f"t{next(dirs)}")
        return SinkTarget(make(d), lambda: read_committed(d), lambda: os.listdir(os.path.join(d, "pending")))

    with pytest.raises(ConformanceError, match=r"^\[sink: exactly once in a job with a crash\]"):
        SINK_CHECKS["exactly_once_in_a_job"](SinkCase(target))
