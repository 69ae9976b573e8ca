"""Shared test set-up: markers' bookkeeping and the fault-injection scenario summary."""

from __future__ import annotations

import itertools
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apache_kafka import ApacheKafkaBroker, ApacheKafkaUnavailableError
from tests.faults.shapes import KEYED_SHAPES, SCENARIO_LOG
from tests.kafka_broker import TansuBroker
from tests.postgres_server import PostgresServer
from tests.runtimes import BOTH
from tests.sinks.conftest import MotoS3, _free_port

_names = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    global SOAK_SAMPLE
    logging.getLogger("sluice").setLevel(logging.ERROR)
    SOAK_SAMPLE = _soak_sample()


def _soak_sample() -> int:
    raw = os.environ.get("SLUICE_SOAK_SAMPLE", "1")
    if not raw.strip().isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"SLUICE_SOAK_SAMPLE must be an integer >= 1 (1: the whole soak), got {raw!r}")
    return int(raw)


#: ``SLUICE_SOAK_SAMPLE=N`` keeps one soak case in N of each soak test (its first always), so that a bounded
#: ``-m soak`` run still walks every soak test; unset, the soak runs whole. Read in pytest_configure, where a
#: bad value is a usage error of one line.
SOAK_SAMPLE = 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # every test on Apache Kafka is marked, so `-m "not apache_kafka"` gives the suite without the JVM broker
    for item in items:
        if "apache_kafka" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.apache_kafka)
    if SOAK_SAMPLE > 1:
        seen: Counter[str] = Counter()
        kept, dropped = [], []
        for item in items:
            if item.get_closest_marker("soak") is None:
                kept.append(item)
                continue
            base = item.nodeid.split("[", 1)[0]
            (kept if seen[base] % SOAK_SAMPLE == 0 else dropped).append(item)
            seen[base] += 1
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept


#: task slots of the session's embedded Spark (local[4,1]): enough for every test's largest parallelism
SPARK_SLOTS = 4


#: the Kafka source's two readers (sluice.connectors.kafka.native_reader): tests that hold on both take the
#: ``kafka_reader`` fixture (module-wide: ``pytestmark = pytest.mark.usefixtures("kafka_reader")``)
KAFKA_READERS = ("python", "native")


@pytest.fixture(params=KAFKA_READERS)
def kafka_reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each Kafka reader in turn: ``reader="auto"`` sources (the default) run on it, in this process and in
    the processes it starts (``SLUICE_KAFKA_READER``). The native one must be built: a test on it fails,
    never skips, where it is not (``pip install -e .`` with cargo on the PATH builds it)."""
    monkeypatch.setenv("SLUICE_KAFKA_READER", str(request.param))
    return str(request.param)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One SparkContext for the whole session (startup takes 5-20 s), reused by every Spark test."""
    from sluice.runtime.spark import spark_context

    sc = spark_context(SPARK_SLOTS)
    yield sc
    sc.stop()


@pytest.fixture(params=BOTH)
def runtime(request: pytest.FixtureRequest) -> str:
    """Each runtime in turn, for job tests that must hold on both (tests/runtimes.py): ``"spark"`` runs on
    the session's SparkContext (the ``spark`` fixture, started once), ``"local"`` in-process."""
    if request.param == "spark":
        request.getfixturevalue("spark")
    return str(request.param)


@pytest.fixture(scope="session")
def broker() -> Iterator[TansuBroker]:
    """A memory-backed tansu broker; fails (does not skip) if it cannot start."""
    b = TansuBroker()
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[ApacheKafkaBroker]:
    """A single-node KRaft Apache Kafka (tests/apache_kafka.py), started once per session by the first test
    that asks for it; fails (does not skip) with one line saying how to get Java or the jars if they are
    missing."""
    b, missing = ApacheKafkaBroker(), None
    try:
        b.start()
    except ApacheKafkaUnavailableError as exc:
        missing = str(exc)
    if missing is not None:
        pytest.fail(missing, pytrace=False)
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server from Debian's package (initdb in a temporary folder, max_prepared_transactions
    raised, 127.0.0.1 at a free port); fails (does not skip) if it cannot start."""
    with PostgresServer() as pg:
        yield pg


@pytest.fixture
def killable_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, for fault tests: ``kill()`` is ``pg_ctl stop -m immediate`` (a
    crash), ``start()`` brings it back (recovering from its WAL). Fails (never skips) if it cannot start."""
    with PostgresServer() as pg:
        yield pg


@pytest.fixture
def topic(broker: TansuBroker, request: pytest.FixtureRequest) -> Callable[..., str]:
    """``topic(partitions=n)`` creates a fresh, uniquely named topic and returns its name."""

    def make(partitions: int = 1) -> str:
        name = f"{request.node.name.split('[')[0][:40]}-{next(_names)}".replace("_", "-")
        broker.create_topic(name, partitions)
        return name

    return make


@pytest.fixture
def kafka_topic(apache_kafka: ApacheKafkaBroker, request: pytest.FixtureRequest) -> Callable[..., str]:
    """``kafka_topic(partitions=n, config=None)`` creates a fresh, uniquely named topic on the session's
    Apache Kafka (with topic ``config``, e.g. :data:`tests.apache_kafka.COMPACTED_TOPIC`) and returns its
    name."""

    def make(partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"{request.node.name.split('[')[0][:40]}-{next(_names)}".replace("_", "-")
        apache_kafka.create_topic(name, partitions, config=config)
        return name

    return make


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    s3 = MotoS3(f"http://127.0.0.1:{port}", port)
    s3.client().list_buckets()  # raises (and fails the test) if the server is not serving
    saved = {
        k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
    )
    try:
        yield s3
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def clean_source_copy(dest: Path) -> Path:
    """``dest`` filled with the checkout's tracked (and new, not ignored) files: a source tree to build a wheel
    from (building in the checkout would reuse its ``build/`` folder, where files deleted from the source
    linger)."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parent.parent
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, timeout=120,
    )  # fmt: skip
    if tracked.returncode == 0:
        for name in filter(None, tracked.stdout.decode().split("\0")):
            if (root / name).is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / name, dest / name)
    else:  # not a git checkout (an unpacked source archive): everything but build products
        shutil.copytree(root, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".venv", "build", "dist", "*.egg-info", "__pycache__", ".git", "target", "*.so"))  # fmt: skip
    return dest


@pytest.fixture(scope="session")
def sluice_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sluice wheel, built once per session from a clean copy of the checkout (:func:`clean_source_copy`)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    src = clean_source_copy(tmp_path_factory.mktemp("sluice-src"))
    dist = tmp_path_factory.mktemp("sluice-dist")
    # the native reader's Rust build reuses the checkout's (native/target): warm, it takes seconds
    env = {**os.environ, "CARGO_TARGET_DIR": str(root / "native" / "target")}
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = dist.glob("sluice_etl-*.whl")  # the distribution sluice-etl (the import name is sluice)
    return wheel


#: the scenarios of every finished test, gathered from test reports: under pytest-xdist (``-n 2``, for the
#: soak) tests run in worker processes and only their reports reach this one
_SCENARIOS: list[dict[str, Any]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if call.when == "call" and SCENARIO_LOG:
        report = outcome.get_result()
        report.user_properties.extend(("fault-scenario", s) for s in SCENARIO_LOG)
        SCENARIO_LOG.clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SCENARIOS.extend(v for k, v in report.user_properties if k == "fault-scenario")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _SCENARIOS:
        fired = [s for s in _SCENARIOS if s["fired"]]
        terminalreporter.write_sep("=", "fault injection")
        terminalreporter.write_line(
            f"{len(_SCENARIOS)} scenarios, {len(fired)} with faults fired, "
            f"{sum(s['crashes'] for s in fired)} crashes, {sum(s['lost'] for s in fired)} lost, "
            f"{sum(s['duplicated'] for s in fired)} duplicated"
        )
        modes = sorted({s["mode"] for s in _SCENARIOS})
        terminalreporter.write_line(
            "fired by mode: " + ", ".join(f"{m} {sum(1 for s in fired if s['mode'] == m)}" for m in modes)
        )
        keyed = [s for s in _SCENARIOS if s["shape"] in KEYED_SHAPES]
        if keyed:  # the shapes with keyed state, per state backend (issue 24)
            backends = sorted({s.get("backend", "hashmap") for s in keyed})
            terminalreporter.write_line(
                "keyed shapes fired by state backend: "
                + ", ".join(f"{b} {sum(1 for s in keyed if s['fired'] and s.get('backend', 'hashmap') == b)}" for b in backends)
            )
        beyond = sorted({s["family"] for s in _SCENARIOS if s.get("tier") == "beyond"})
        if beyond:  # the faults that are not crashes (tests/faults/beyond.py): outages, full disks, lost files
            terminalreporter.write_line(
                "beyond crashes, fired by family: "
                + ", ".join(f"{f} {sum(1 for s in fired if s['family'] == f)}" for f in beyond)
            )
