"""Bad input gets one clear line, and errors a restart cannot cure fail the job at once.

Each case runs ``sluice run`` as a user would (a subprocess, a job file) and checks what the user sees:
exit code 1, the message naming what is wrong, no traceback unless ``-v``, and for errors a restart
cannot cure a single attempt (the restart strategy below allows three more).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, ConfigError, FixedDelayRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.connectors.kafka import KafkaSource
from sluice.errors import BadRecordError, SluiceError, is_recoverable
from sluice.sinks.files import FileSink

from tests.connectors.kafka.helpers import produce_json
from tests.kafka_broker import TansuBroker

JOB = """
import pyarrow as pa
from sluice import CheckpointConfig, FixedDelayRestart, Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

p = Pipeline("{name}", checkpoint=CheckpointConfig(interval=0.5, storage={chk!r}),
             restart=FixedDelayRestart(attempts=3, delay=0.5))
{body}
pipeline = p
"""


def sluice_run(tmp: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    job = tmp / "job.py"
    job.write_text(JOB.format(name="bad-input", chk=str(tmp / "chk"), body=textwrap.dedent(body)))
    cmd = [sys.executable, "-m", "sluice.cli", *args, "run", str(job), "--runtime", "local", "--restore", "none"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)


def one_line_error(r: subprocess.CompletedProcess[str], *expected: str) -> str:
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, r.stderr
    for text in expected:
        assert text in errors[0], errors[0]
    return errors[0]


def test_a_wrong_option_is_one_line_and_verbose_shows_the_traceback(tmp_path: Path) -> None:
    body = 'p.source(KafkaSource("127.0.0.1:9", "t", format="xml")).sink(FileSink({out!r}))'.format(
        out=str(tmp_path / "out")
    )
    one_line_error(sluice_run(tmp_path, body), "KafkaSource: format must be one of", "'xml'")
    verbose = sluice_run(tmp_path, body, "-v")
    assert "Traceback" in verbose.stderr and "ConfigError" in verbose.stderr


def test_a_missing_tls_file_is_named_at_build_time(tmp_path: Path) -> None:
    body = f"""
    conf = {{"security.protocol": "ssl", "ssl.ca.location": {str(tmp_path / "nope.pem")!r}}}
    p.source(KafkaSource("127.0.0.1:9", "t", consumer_config=conf)).sink(FileSink({str(tmp_path / "o")!r}))
    """
    one_line_error(sluice_run(tmp_path, body), "consumer_config['ssl.ca.location']", "no such file", "nope.pem")


def test_a_column_a_format_cannot_write_fails_at_build_time(tmp_path: Path) -> None:
    """Raw Kafka headers (a list of structs) into CSV: refused when the job is built, naming sink and column."""
    body = f'p.source(KafkaSource("127.0.0.1:9", "t")).sink(FileSink({str(tmp_path / "o")!r}, format="csv"))'
    one_line_error(sluice_run(tmp_path, body), "FileSink", "column 'headers'", "format 'csv' cannot write")


def test_a_column_type_unknown_at_build_time_fails_at_once_at_run_time(tmp_path: Path) -> None:
    """Behind map_batches the job cannot know the schema: the writer refuses it, without restarts."""
    nested = lambda b: b.append_column("tags", pa.array([[1]] * b.num_rows))  # noqa: E731
    p = Pipeline(
        "nested-csv",
        checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")),
        restart=FixedDelayRestart(attempts=3, delay=0.0),
    )
    p.source(GeneratorSource(num_splits=1, records_per_split=10)).map_batches(nested).sink(
        FileSink(str(tmp_path / "out"), format="csv")
    )
    with pytest.raises(ConfigError, match=r"column 'tags'.*format 'csv' cannot write"):
        p.run(runtime="local", restore="none")
    with pytest.raises(ConfigError, match="column 'tags'"):  # the same refusal before anything runs
        FileSink(str(tmp_path / "o2"), format="csv").validate_schema(pa.schema([("tags", pa.list_(pa.int64()))]))


@pytest.mark.tansu("error messages and declared schemas over a few plain records to explicit stops: no tansu quirk touched")
def test_every_source_that_declares_its_schema_emits_it(broker: TansuBroker, topic: Any, tmp_path: Path) -> None:
    """What a sink checks at build time is what arrives at run time (raw Kafka columns and metadata)."""
    name = topic(partitions=1)
    produce_json(broker, name, {0: range(5)})
    schema = pa.schema([("id", pa.int64())])
    for i, src in enumerate((
        KafkaSource(broker.bootstrap, name, stopping_offsets={(name, 0): 5}),
        KafkaSource(broker.bootstrap, name, format="json", schema=schema, include_metadata=True,
                    stopping_offsets={(name, 0): 5}),
        GeneratorSource(num_splits=1, records_per_split=5),
    )):
        seen: list[pa.Schema] = []
        p = Pipeline("schemas", checkpoint=CheckpointConfig(interval=0.2, storage=str(tmp_path / "chk")))
        out = FileSink(str(tmp_path / f"o{i}"))  # one output each: a fresh start into output the job wrote is refused
        p.source(src).map_batches(lambda b, seen=seen: seen.append(b.schema) or b).sink(out)
        p.run(runtime="local", restore="none")
        assert seen and all(s.equals(src.output_schema) for s in seen), (seen[0], src.output_schema)


@pytest.mark.tansu("error messages and declared schemas over a few plain records to explicit stops: no tansu quirk touched")
@pytest.mark.kafka
def test_a_missing_topic_fails_at_once(broker: TansuBroker, tmp_path: Path) -> None:
    body = f'p.source(KafkaSource({broker.bootstrap!r}, "no-such-topic", stopping_offsets="latest")).sink(FileSink({str(tmp_path / "o")!r}))'
    line = one_line_error(sluice_run(tmp_path, body), "'no-such-topic' not found")
    assert "attempt(s)" not in line  # no restart was spent on it


@pytest.mark.tansu("error messages and declared schemas over a few plain records to explicit stops: no tansu quirk touched")
@pytest.mark.kafka
def test_a_bad_record_with_on_bad_record_fail_fails_at_once(broker: TansuBroker, topic: Any, tmp_path: Path) -> None:
    name = topic(partitions=1)
    broker.produce(name, [b'{"id": 1}', b"{not json", b'{"id": 3}'], partition=0)
    body = f"""
    schema = pa.schema([("id", pa.int64())])
    p.source(KafkaSource({broker.bootstrap!r}, {name!r}, format="json", schema=schema,
                         stopping_offsets={{({name!r}, 0): 3}})).sink(FileSink({str(tmp_path / "o")!r}))
    """
    r = sluice_run(tmp_path, body)
    line = one_line_error(r, f"topic={name!r}", "partition=0", "offset=1")
    assert "attempt(s)" not in line
    assert r.stderr.count("failed:") <= 1, r.stderr  # one attempt, not four


@pytest.mark.kafka
def test_an_unreachable_broker_is_one_clear_error_and_a_handful_of_lines(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    body = f'p.source(KafkaSource("127.0.0.1:{port}", "t", request_timeout_s=3, stopping_offsets="latest")).sink(FileSink({str(tmp_path / "o")!r}))'
    r = sluice_run(tmp_path, body)
    one_line_error(r, "cannot reach the Kafka brokers", f"127.0.0.1:{port}", "within 3s", "failing at once")
    assert len(r.stderr.splitlines()) <= 5, r.stderr  # librdkafka repeats itself hundreds of times


def test_checkpoints_list_on_a_folder_that_is_not_checkpoint_storage(tmp_path: Path) -> None:
    (tmp_path / "photos" / "2024").mkdir(parents=True)
    r = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "checkpoints", "list", str(tmp_path / "photos")],
        capture_output=True, text=True, timeout=120,
    )
    one_line_error(r, "is not checkpoint storage", "CheckpointConfig.storage")


def test_recoverable_follows_the_cause_chain() -> None:
    bad = BadRecordError("x", topic="t", partition=0, offset=1)
    assert not is_recoverable(bad) and not is_recoverable(ConfigError("x"))
    assert is_recoverable(SluiceError("transient")) and is_recoverable(ValueError("user bug"))
    assert not is_recoverable(SluiceError("not this time", recoverable=False))
    try:
        try:
            raise bad
        except BadRecordError as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert not is_recoverable(wrapped)
