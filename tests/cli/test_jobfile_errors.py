"""``sluice run`` on a job file that is itself wrong: what its author sees.

A misspelled keyword argument is one line naming the file and line, the class, the wrong keyword, the
closest allowed one and the others (it was a 35-line traceback through runpy and click); any other
exception shows the traceback of the job file's own frames only, ``-v`` all of it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sluice.cli.jobfile import keyword_error
from sluice.connectors.kafka import KafkaSource

BAD_KEYWORD = """\
from sluice import Pipeline
from sluice.connectors.kafka import KafkaSource
from sluice.sinks.files import FileSink

pipeline = Pipeline("typo", parallelism=1)
src = KafkaSource(bootstrap_server="localhost:9092", topics=["t"], format="json")
pipeline.source(src).sink(FileSink("./out"))
"""


def sluice(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sluice.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)


def test_a_misspelled_keyword_is_one_line_with_the_closest_allowed_one(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(BAD_KEYWORD)
    r = sluice(tmp_path, "run", "job.py", "--runtime", "local")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: job.py:6: KafkaSource has no keyword argument 'bootstrap_server' "), lines
    assert "(did you mean 'bootstrap_servers'? allowed: bootstrap_servers, topics, " in lines[0], lines
    # -v keeps the traceback for whoever wants it
    r = sluice(tmp_path, "-v", "run", "job.py", "--runtime", "local")
    assert r.returncode == 1 and "Traceback" in r.stderr, r.stderr


def test_other_errors_show_the_job_files_frames_only(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("import json\n\n\ndef build():\n    return json.loads('{')\n\n\nbuild()\n")
    r = sluice(tmp_path, "run", "job.py", "--runtime", "local")
    assert r.returncode == 1, r.stderr
    assert 'File "job.py", line 8, in <module>' in r.stderr and "line 5, in build" in r.stderr, r.stderr
    assert "runpy" not in r.stderr and "click" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("Error: job.py failed while loading: JSONDecodeError: ")


def test_keyword_error_resolves_methods_and_functions() -> None:
    def call(fn: object, *args: object, **kw: object) -> TypeError:
        with pytest.raises(TypeError) as info:
            fn(*args, **kw)  # type: ignore[operator]
        return info.value

    err = keyword_error(call(KafkaSource, bootstrap_server="x"), __file__)
    assert err is not None and "did you mean 'bootstrap_servers'?" in str(err)
    assert f"{__file__}:" in str(err)
    def local(alpha: int) -> int:
        return alpha

    err = keyword_error(call(local, alpah=1), __file__)  # not resolvable from the call site: no list
    assert err is not None and str(err).endswith("local has no keyword argument 'alpah'"), err
    assert keyword_error(TypeError("unsupported operand type(s)"), __file__) is None
