"""Errors at run time as clear as at build time: what a job's author sees when their own code is wrong.

* an exception in a user function (map, filter, a KeyedProcessFunction) names the user's file and line,
  not only sluice's operator;
* a syntax error in the job file is one line (``job.py:3:12: SyntaxError: ...``), not a traceback;
* a typo in ``CheckpointConfig`` (an unknown option, a value not allowed, a wrong type) is one line with
  the closest allowed option or value, and, in a job file, the file and line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from sluice import CheckpointConfig, ConfigError, NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.errors import JobFailedError, UserFunctionError
from sluice.functions import KeyedProcessFunction
from sluice.sinks.files import FileSink


def sluice(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sluice.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)


def errors(r: subprocess.CompletedProcess[str]) -> list[str]:
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return [line for line in r.stderr.splitlines() if line.startswith("Error: ")]


FAILING_MAP = """\
from sluice import NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import FileSink


def price(row):
    return {"id": row["id"], "price": 100 / (row["id"] - 7)}


pipeline = Pipeline("failing-map", checkpoint={"storage": "./checkpoints"}, restart=NoRestart())
pipeline.source(GeneratorSource(num_splits=1, records_per_split=20)).map(price).sink(FileSink("./out"))
"""


def test_a_failing_map_names_the_users_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(FAILING_MAP)
    (line,) = errors(sluice(tmp_path, "run", "job.py", "--runtime", "local", "--no-progress"))
    assert "operator 'map' failed at job.py:7 (in price): ZeroDivisionError: division by zero" in line, line


class Explodes(KeyedProcessFunction):
    def process(self, key, batch, ctx):  # type: ignore[no-untyped-def]
        if 13 in batch.column("id").to_pylist():
            raise ValueError("no 13 here")
        return batch


def test_a_failing_keyed_process_function_names_its_line(tmp_path: Path) -> None:
    p = Pipeline("failing-kpf", checkpoint={"storage": str(tmp_path / "chk")}, restart=NoRestart())
    src = p.source(GeneratorSource(num_splits=1, records_per_split=40, batch_size=5))
    src.key_by("key").process(Explodes(), schema=src.schema).sink(FileSink(str(tmp_path / "out")))
    with pytest.raises(JobFailedError) as err:
        p.run(runtime="local", restore="none", control_endpoint=None)
    cause = err.value.__cause__
    assert isinstance(cause, UserFunctionError), repr(cause)
    line = Explodes.process.__code__.co_firstlineno + 2
    assert cause.location == f"{__file__}:{line} (in process)", cause.location
    assert f"failed at {__file__}:{line} (in process): ValueError: no 13 here" in str(err.value), str(err.value)


def test_a_syntax_error_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text('from sluice import Pipeline\n\npipeline = Pipeline("x"\nq = 1\n')
    r = sluice(tmp_path, "run", "job.py", "--runtime", "local")
    assert r.stderr.strip().splitlines() == errors(r), r.stderr
    assert errors(r) == ["Error: job.py:3:20: SyntaxError: '(' was never closed: pipeline = Pipeline(\"x\""], r.stderr
    r = sluice(tmp_path, "-v", "run", "job.py", "--runtime", "local")  # -v: the traceback too
    assert r.returncode == 1 and "SyntaxError" in r.stderr and len(r.stderr.splitlines()) > 1, r.stderr


def test_a_checkpoint_config_typo_is_one_line_with_did_you_mean(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        CheckpointConfig(intervall=5.0)  # type: ignore[call-arg]
    assert str(err.value).startswith(
        "invalid CheckpointConfig: unknown option 'intervall' (did you mean 'interval'? allowed: interval, mode, "
    ), err.value
    with pytest.raises(ConfigError, match=r"mode: 'exactly' is not allowed \(did you mean 'exactly_once'\? "):
        CheckpointConfig(mode="exactly")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^invalid CheckpointConfig: max_concurrent: must be a valid integer"):
        CheckpointConfig(max_concurrent="two")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"unknown option 'storag' \(did you mean 'storage'\?"):
        Pipeline("dict-typo", checkpoint={"storag": "./x"})
    (tmp_path / "job.py").write_text(
        "from sluice import CheckpointConfig, Pipeline\n\n"
        'pipeline = Pipeline("typo", checkpoint=CheckpointConfig(storage="./c", unalinged=True))\n'
    )
    (line,) = errors(sluice(tmp_path, "run", "job.py", "--runtime", "local"))
    assert line.startswith(
        "Error: job.py:3: invalid CheckpointConfig: unknown option 'unalinged' (did you mean 'unaligned'? allowed: "
    ), line


def test_an_unknown_key_of_the_config_file_has_did_you_mean(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(FAILING_MAP)
    (tmp_path / "conf.yaml").write_text("execution:\n  checkpointing:\n    intervall: 5 s\n")
    (line,) = errors(sluice(tmp_path, "run", "job.py", "--runtime", "local", "--conf", "conf.yaml"))
    assert "unknown setting 'execution.checkpointing.intervall' (did you mean 'execution.checkpointing.interval'?)" in line


def test_a_frame_of_a_library_is_not_the_users() -> None:
    def call_pyarrow() -> None:
        pa.array([1, "x"])  # raises inside pyarrow: the user's frame is this one

    with pytest.raises(pa.ArrowException) as info:
        call_pyarrow()
    err = UserFunctionError("map", info.value)
    assert err.location == f"{__file__}:{call_pyarrow.__code__.co_firstlineno + 1} (in call_pyarrow)", err.location
