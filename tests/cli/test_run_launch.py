"""``sluice run`` on a job file that runs its own pipeline: ``p.run()`` takes the command line's options.

As ``env.execute()`` under ``flink run``: the file runs as ``__main__``, and a ``Pipeline.run()`` call in
it (module level or under ``if __name__ == "__main__":``, whatever the variable's name) runs the job with
``sluice run``'s runtime, control endpoint, progress and savepoint on SIGTERM. An option given on the
command line wins over the call's argument; the call's wins over the command line's default.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sluice import Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import FileSink

RUNS_ITSELF = """\
from sluice import Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.files import FileSink


def main():
    job = Pipeline("runs-itself", checkpoint={"interval": 0.5, "storage": "./checkpoints"})
    a = job.source(GeneratorSource(num_splits=1, records_per_split=30))
    b = job.source(GeneratorSource(num_splits=1, records_per_split=20))
    a.union(b).sink(FileSink("./out", format="json"))
    result = job.run(runtime="local", restore="none")
    print("the file got", result.status, result.metrics.get("records_in", "?"))


if __name__ == "__main__":
    main()
"""


def sluice(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sluice.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)


def _rows(folder: Path) -> int:
    return sum(len(f.read_text().splitlines()) for f in folder.glob("part-*.jsonl"))


def test_a_run_call_in_the_file_runs_with_the_command_lines_options(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(RUNS_ITSELF)
    r = sluice(tmp_path, "run", "job.py", "--progress-interval", "0.5")  # runtime: the call's "local"
    assert r.returncode == 0, r.stderr
    assert "job runs-itself: control endpoint and dashboard at http://127.0.0.1:" in r.stderr, r.stderr
    assert "runs-itself finished" in r.stderr, r.stderr  # a progress line
    lines = r.stdout.splitlines()
    assert lines[0].startswith("job runs-itself: finished after 1 attempt(s)"), r.stdout
    assert lines[1].startswith("the file got finished"), r.stdout  # the file goes on with the result
    assert _rows(tmp_path / "out") == 50  # both unnamed sources read, once
    # given on the command line, an option wins over the call's: the latest checkpoint restored (the
    # call says restore="none", which the sinks would refuse: they hold that checkpoint), no endpoint
    r = sluice(tmp_path, "run", "job.py", "--control-endpoint", "none", "--no-progress", "--restore", "latest")
    assert r.returncode == 0 and "control endpoint" not in r.stderr and "read " not in r.stderr, r.stderr
    assert r.stdout.startswith("job runs-itself: finished after 1 attempt(s)"), r.stdout
    assert _rows(tmp_path / "out") == 50


def test_a_pipeline_of_any_name_is_found_and_several_are_named(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(
        "from sluice import Pipeline\nfrom sluice.connectors.generator import GeneratorSource\n"
        "from sluice.sinks.files import FileSink\n\n"
        'p = Pipeline("any-name", checkpoint={"storage": "./checkpoints"})\n'
        'p.source(GeneratorSource(num_splits=1, records_per_split=10)).sink(FileSink("./out", format="json"))\n'
    )
    r = sluice(tmp_path, "run", "job.py", "--runtime", "local", "--no-progress")
    assert r.returncode == 0 and "job any-name: finished" in r.stdout, r.stderr
    (tmp_path / "two.py").write_text('from sluice import Pipeline\na = Pipeline("a")\nb = Pipeline("b")\n')
    r = sluice(tmp_path, "run", "two.py", "--runtime", "local")
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "Error: two.py defines several pipelines (a, b): name the one to run `pipeline`, or call its run() "
        "in the file"
    ], r.stderr


def test_unnamed_sources_and_sinks_of_one_kind_get_distinct_names() -> None:
    p = Pipeline("names")
    a = p.source(GeneratorSource(num_splits=1))
    b = p.source(GeneratorSource(num_splits=1))
    a.sink(FileSink("/tmp/x", format="json"))
    b.sink(FileSink("/tmp/y", format="json"))
    named = p.source(GeneratorSource(num_splits=1), name="generator-3")
    c = p.source(GeneratorSource(num_splits=1))  # generator-3 is taken: the next free one
    names = sorted(n.name for n in p.graph.nodes.values())
    assert names == ["file-sink", "file-sink-2", "generator", "generator-2", "generator-3", "generator-4"], names
    assert named is not c


def test_a_template_prints_its_result_line_once_under_sluice_run(tmp_path: Path) -> None:
    """The template's own ``if __name__ == "__main__":`` block runs under ``sluice run`` too (the file is
    ``__main__``): it prints its line only where sluice run did not (``python job.py``, spark-submit:
    tests/runtime/spark/test_user_facing_output.py)."""
    r = sluice(tmp_path, "new", "gen_once", "--template", "generator-to-parquet")
    assert r.returncode == 0, r.stderr
    r = sluice(tmp_path, "run", "gen_once.py", "--runtime", "local", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("finished after 1 attempt(s)") == 1, r.stdout
    assert r.stdout.startswith("job gen_once: finished after 1 attempt(s); last checkpoint "), r.stdout


def test_the_resume_line_repeats_the_options_a_resumed_run_needs() -> None:
    from sluice.cli.run import _again, _Launch

    explicit = {"runtime", "restore", "conf", "overrides", "allow_reprocessing"}
    again = _again(explicit, "local", None, "job yaml.yaml", ("execution.checkpointing.interval=30 s",), "127.0.0.1:0")
    line = _Launch("job.py", {}, {}, set(), None, again).resume_line("/data/chk/savepoint-4")
    assert line == (
        "sluice run job.py --runtime local --conf 'job yaml.yaml' -D 'execution.checkpointing.interval=30 s' "
        "--restore /data/chk/savepoint-4"
    )
    # nothing given: nothing repeated (the file's own run() call, or the defaults, decide again)
    assert _Launch("job.py", {}, {}, set(), None, []).resume_line("p") == "sluice run job.py --restore p"
