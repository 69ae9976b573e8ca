"""Configuration outside the code: Flink's key names from a YAML file and -D, over what the code sets."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sluice import (
    CheckpointConfig,
    ConfigError,
    ExponentialBackoffRestart,
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
    Pipeline,
)
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.settings import KEYS, configure, load_settings, parse_duration, parse_overrides


def pipeline() -> Pipeline:
    return Pipeline(
        "configured",
        parallelism=2,
        checkpoint=CheckpointConfig(interval=5.0, storage="/tmp/code-chk", tolerable_failed_checkpoints=1),
        restart=FixedDelayRestart(attempts=2, delay=3.0),
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500 ms", 0.5), ("30 s", 30.0), ("30s", 30.0), ("2 min", 120.0), ("1h", 3600.0), ("1 d", 86400.0),
     ("1.5 seconds", 1.5), ("10 milliseconds", 0.01)],
)
def test_durations_take_flink_units(text: str, seconds: float) -> None:
    assert parse_duration("k", text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5000", 5000, 2.5, "30 parsecs", "", "s"])
def test_a_duration_without_a_known_unit_is_refused_naming_the_key(text: str | float) -> None:
    """A bare number too: Flink reads it as milliseconds, sluice's Python options as seconds."""
    with pytest.raises(ConfigError, match=r"execution.checkpointing.interval: .* is not a duration") as err:
        parse_duration("execution.checkpointing.interval", text)
    assert "\n" not in str(err.value)
    if text in ("5000", 5000, 2.5):
        assert "a bare number is refused: Flink reads it as milliseconds" in str(err.value)


def test_a_negative_duration_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"execution.checkpointing.interval: must be a duration >= 0 \(got '-1 s'\)"):
        parse_duration("execution.checkpointing.interval", "-1 s")


def test_every_checkpoint_key_reaches_its_option() -> None:
    p = configure(
        pipeline(),
        {
            "execution.checkpointing.interval": "30 s",
            "execution.checkpointing.timeout": "10 min",
            "execution.checkpointing.min-pause": "500 ms",
            "execution.checkpointing.max-concurrent-checkpoints": 2,
            "execution.checkpointing.tolerable-failed-checkpoints": "3",
            "execution.checkpointing.aligned-checkpoint-timeout": "2 s",
            "execution.checkpointing.num-retained": 4,
            "execution.checkpointing.externalized-checkpoint-retention": "DELETE_ON_CANCELLATION",
            "state.checkpoints.dir": "s3://bucket/chk",
            "s3.endpoint": "http://127.0.0.1:9000",
            "parallelism.default": 3,
            "pipeline.max-parallelism": 64,
        },
    )
    c = p.checkpoint
    assert (c.interval, c.timeout, c.min_pause, c.max_concurrent) == (30.0, 600.0, 0.5, 2)
    assert (c.tolerable_failed_checkpoints, c.aligned_checkpoint_timeout, c.num_retained) == (3, 2.0, 4)
    assert c.retain_on_cancel is False and c.storage == "s3://bucket/chk"
    assert c.storage_options == {"endpoint_url": "http://127.0.0.1:9000"}
    assert (p.graph.default_parallelism, p.graph.max_parallelism) == (3, 64)
    assert configure(pipeline(), {"execution.checkpointing.mode": "AT_LEAST_ONCE"}).checkpoint.mode == "at_least_once"
    assert configure(pipeline(), {"execution.checkpointing.unaligned.enabled": "true"}).checkpoint.unaligned


def test_restart_strategies_by_flink_keys() -> None:
    assert isinstance(configure(pipeline(), {"restart-strategy.type": "none"}).restart, NoRestart)
    fixed = configure(pipeline(), {"restart-strategy.fixed-delay.attempts": 7}).restart
    assert fixed == FixedDelayRestart(attempts=7, delay=3.0)  # the code's delay is kept
    exp = configure(
        pipeline(),
        {
            "restart-strategy.type": "exponential-delay",
            "restart-strategy.exponential-delay.initial-backoff": "1 s",
            "restart-strategy.exponential-delay.max-backoff": "1 min",
            "restart-strategy.exponential-delay.backoff-multiplier": "1.5",
            "restart-strategy.exponential-delay.attempts-before-reset-backoff": 10,
        },
    ).restart
    assert exp == ExponentialBackoffRestart(initial=1.0, max_delay=60.0, multiplier=1.5, max_attempts=10)
    rate = configure(
        pipeline(),
        {
            "restart-strategy.type": "failure-rate",
            "restart-strategy.failure-rate.max-failures-per-interval": 2,
            "restart-strategy.failure-rate.failure-rate-interval": "5 min",
        },
    ).restart
    assert rate == FailureRateRestart(max_failures=2, interval=300.0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"execution.checkpointing.intervall": "1 s"}, "unknown setting .*did you mean 'execution.checkpointing.interval'"),
        ({"execution.checkpointing.mode": "twice"}, "mode: 'twice' is not allowed .*at-least-once, exactly-once"),
        ({"execution.checkpointing.max-concurrent-checkpoints": "many"}, "max-concurrent-checkpoints: 'many' is not an integer"),
        ({"execution.checkpointing.max-concurrent-checkpoints": 0}, "max_concurrent must be an integer >= 1"),
        ({"restart-strategy.failure-rate.delay": "1 s"}, "restart-strategy.failure-rate.* set without restart-strategy.type"),
        ({"restart-strategy.type": "none", "restart-strategy.fixed-delay.attempts": 1}, "does not apply to restart-strategy.type"),
        ({"parallelism.default": 0}, "parallelism.default: must be an integer >= 1"),
    ],
)
def test_wrong_settings_are_one_line_errors_naming_the_key(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        configure(pipeline(), settings)
    assert "\n" not in str(err.value)


def test_yaml_nested_or_flat_and_overrides(tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(
        textwrap.dedent(
            """
            execution:
              checkpointing:
                interval: 30 s
                unaligned: true
            state.checkpoints.dir: /data/chk
            """
        )
    )
    assert load_settings(str(f)) == {
        "execution.checkpointing.interval": "30 s",
        "execution.checkpointing.unaligned": True,
        "state.checkpoints.dir": "/data/chk",
    }
    assert parse_overrides(["a.b=1", "c='30 s'", "a.b=2"]) == {"a.b": "2", "c": "30 s"}
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_overrides(["novalue"])
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(str(tmp_path / "bad.yaml"))


def test_every_key_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    missing = [k for k in KEYS if f"`{k}`" not in doc]
    assert not missing, f"docs/configuration.md does not document {missing}"


JOB = """
from sluice import CheckpointConfig, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink

p = Pipeline("conf-job", checkpoint=CheckpointConfig(interval=60.0, storage="{code}"))
p.source(GeneratorSource(num_splits=2, records_per_split=200, batch_size=20, rows_per_second=2000)).sink(
    TwoPhaseCommitTestSink("{out}"))
pipeline = p
"""


def test_sluice_run_applies_code_then_file_then_d(tmp_path: Path) -> None:
    """The file moves checkpoints to its folder and the interval to 10 s; -D brings the interval to 100 ms:
    the job then completes several periodic checkpoints in the file's folder, none in the code's."""
    (tmp_path / "job.py").write_text(JOB.format(code=tmp_path / "code-chk", out=tmp_path / "out"))
    (tmp_path / "job.yaml").write_text(
        f"state.checkpoints.dir: {tmp_path / 'file-chk'}\nexecution.checkpointing.interval: 10 s\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "run", "job.py", "--runtime", "local", "--conf", "job.yaml",
         "-D", "execution.checkpointing.interval=100 ms"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    stats = checkpoint_storage(str(tmp_path / "file-chk"), "conf-job").read_stats()
    assert len([s for s in stats if s["status"] == "completed"]) >= 2, stats  # 100 ms, not 10 s or 60 s
    assert not (tmp_path / "code-chk").exists()
    bad = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "run", "job.py", "--runtime", "local", "-D", "execution.checkpointing.interval=5000"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "execution.checkpointing.interval: '5000' is not a duration" in bad.stderr


def test_secret_settings_never_show(tmp_path: Path) -> None:
    p = configure(pipeline(), {"s3.access-key": "AKIAEXAMPLE", "s3.secret-key": "sup3rs3cret"})
    assert "sup3rs3cret" not in repr(p.checkpoint) and "sup3rs3cret" not in str(p.checkpoint)


def test_state_backend_keys_reach_the_pipelines_state_backend(tmp_path: Path) -> None:
    """``state.backend.*`` (flat, nested in YAML, or -D) choose the job's state backend over what the code
    set; the choice travels in the job's configuration (to Spark executors too)."""
    conf = tmp_path / "job.yaml"
    conf.write_text("state:\n  backend:\n    type: rocksdb\n    incremental: true\n    rocksdb:\n      memory:\n        fixed-per-slot: 64 mb\n")
    p = configure(Pipeline("s", state_backend={"local_dir": str(tmp_path)}), load_settings(str(conf)))
    cfg = p.job_config().state_backend
    assert (cfg.type, cfg.incremental, cfg.memory, cfg.local_dir) == ("rocksdb", True, 64 << 20, str(tmp_path))
    p = configure(p, parse_overrides(["state.backend=hashmap"]))
    assert p.state_backend.type == "hashmap" and p.state_backend.incremental


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"state.backend.type": "leveldb"}, "state.backend.type: 'leveldb' is not allowed (allowed: hashmap, rocksdb)"),
        ({"state.backend.incremental": "yes"}, "state.backend.incremental: 'yes' is not a boolean"),
        ({"state.backend.rocksdb.memory.fixed-per-slot": "lots"}, "not a memory size"),
    ],
)
def test_a_wrong_state_backend_value_is_one_line_naming_the_key(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        configure(pipeline(), settings)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_pipeline_refuses_a_wrong_state_backend_option() -> None:
    with pytest.raises(ConfigError, match="state_backend: expected a StateBackendConfig or a dict"):
        Pipeline("s", state_backend="rocksdb")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="type"):
        Pipeline("s", state_backend={"type": "leveldb"})
