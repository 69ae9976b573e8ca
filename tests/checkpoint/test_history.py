"""Checkpoint history that cannot be silently skipped (issue 21, point 2).

The job keeps an index of its completed checkpoints (``<job-dir>/_checkpoints``, as Flink's
completed-checkpoint store); with the newest records of the stats history (``_stats/``) it says which
checkpoint completed last. Restoring
"latest" when that one is missing or unreadable is refused with one line that names it and says how to
restore an older one on purpose; never an older checkpoint or an empty start in its place. A corrupt file
is named. A checkpoint folder restores from wherever it is copied. A folder of the format before issue 39
(every stats record in one ``_stats.jsonl``) still guards and restores.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from sluice import CheckpointConfig, NoRestart, Pipeline
from sluice.checkpoint.history import INDEX, read_index
from sluice.checkpoint.stats_log import LEGACY_STATS, STATS_DIR, CheckpointStatsLog
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.connectors.generator import GeneratorSource
from sluice.errors import RestoreError
from sluice.runtime.job import JobConfig, RunRestore, resolve_restore
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed

from tests.faults.shapes import _Lingering

RECORDS = 3000


def bounded(tmp: Path, name: str = "hist", out: str = "out") -> Pipeline:
    """A bounded job that completes several checkpoints and retains three."""
    p = Pipeline(
        name,
        checkpoint=CheckpointConfig(interval=0.05, num_retained=3, storage=str(tmp / "chk")),
        restart=NoRestart(),
    )
    src = _Lingering(  # ends only after 3 completed checkpoints, however loaded the machine
        num_splits=2, records_per_split=RECORDS // 2, batch_size=50, rows_per_second=10000)
    p.source(src).sink(TwoPhaseCommitTestSink(str(tmp / out)))
    return p


def committed(tmp: Path, out: str = "out") -> list[int]:
    table = read_committed(str(tmp / out))
    return sorted(table.column("id").to_pylist()) if table is not None else []


def finished_job(tmp: Path, name: str = "hist") -> list[Path]:
    """Run the bounded job to its end; its retained checkpoint folders, oldest first."""
    result = bounded(tmp, name).run(runtime="local", restore="none", control_endpoint=None)
    assert result.status == "finished" and committed(tmp) == list(range(RECORDS))
    chks = sorted((tmp / "chk" / name).glob("chk-*"), key=lambda d: int(d.name.split("-")[1]))
    assert len(chks) == 3, chks
    return chks


def wait_for_a_checkpoint(client: Any) -> None:
    deadline = time.monotonic() + 120  # however loaded the machine
    while not any(c.status == "completed" for c in client.checkpoint_history):
        assert client.running and time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.02)


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def test_the_index_lists_the_retained_completed_checkpoints(tmp_path: Path) -> None:
    chks = finished_job(tmp_path)
    index = json.loads((tmp_path / "chk" / "hist" / INDEX).read_text())
    assert [(e["id"], e["dir"], e["kind"]) for e in index["checkpoints"]] == [
        (int(d.name.split("-")[1]), d.name, "checkpoint") for d in chks
    ]


def test_latest_refuses_when_the_newest_checkpoint_lost_its_metadata(tmp_path: Path) -> None:
    chks = finished_job(tmp_path)
    (chks[-1] / "_metadata").unlink()
    with pytest.raises(RestoreError) as ei:
        bounded(tmp_path).run(runtime="local", restore="latest", control_endpoint=None)
    text = one_line(ei.value)
    assert f"newest completed checkpoint {chks[-1].name.split('-')[1]} ({chks[-1]})" in text, text
    assert "it has no _metadata file" in text and "--restore <path>" in text and str(chks[-2]) in text, text
    assert committed(tmp_path) == list(range(RECORDS)), "nothing was restored behind the user's back"
    # restoring the older one on purpose works (the sink's output holds the newer one: reprocessing allowed)
    again = bounded(tmp_path).run(
        runtime="local", restore=str(chks[-2]), allow_reprocessing=True, control_endpoint=None
    )
    assert again.status == "finished"


def test_latest_refuses_when_every_metadata_is_gone_instead_of_starting_empty(tmp_path: Path) -> None:
    for chk in finished_job(tmp_path):
        (chk / "_metadata").unlink()
    with pytest.raises(RestoreError, match=r"is missing: it has no _metadata file.*--restore none"):
        bounded(tmp_path).run(runtime="local", restore="latest", control_endpoint=None)
    assert committed(tmp_path) == list(range(RECORDS)), "the job did not start from scratch"


def test_latest_refuses_when_the_index_alone_remembers_the_newest(tmp_path: Path) -> None:
    """The stats history lost as well: the index still says which checkpoint completed last."""
    chks = finished_job(tmp_path)
    shutil.rmtree(tmp_path / "chk" / "hist" / STATS_DIR)
    shutil.rmtree(chks[-1])
    with pytest.raises(RestoreError, match="its folder is gone"):
        bounded(tmp_path).run(runtime="local", restore="latest", control_endpoint=None)


def test_latest_refuses_when_the_stats_history_alone_remembers_the_newest(tmp_path: Path) -> None:
    """The index lost (or not rewritten yet when the process died): the newest stats segment still says
    which checkpoint completed last."""
    chks = finished_job(tmp_path)
    (tmp_path / "chk" / "hist" / INDEX).unlink()
    (chks[-1] / "_metadata").unlink()
    with pytest.raises(RestoreError, match=f"checkpoint {chks[-1].name.split('-')[1]} .*it has no _metadata"):
        bounded(tmp_path).run(runtime="local", restore="latest", control_endpoint=None)


@pytest.mark.parametrize("damage", ["truncated metadata", "metadata not json", "empty state file"])
def test_a_corrupt_newest_checkpoint_is_named(tmp_path: Path, damage: str) -> None:
    chks = finished_job(tmp_path)
    newest = chks[-1]
    if damage == "truncated metadata":
        bad = newest / "_metadata"
        bad.write_bytes(bad.read_bytes()[:100])
    elif damage == "metadata not json":
        bad = newest / "_metadata"
        bad.write_bytes(b"\x00\xff garbage")
    else:
        # the state file the metadata names for subtask 0.0 (a finished subtask's: <vertex>-<index>.final.state)
        bad = newest / json.loads((newest / "_metadata").read_bytes())["tasks"]["0.0"]["path"]
        bad.write_bytes(b"")
    with pytest.raises(RestoreError) as ei:
        bounded(tmp_path).run(runtime="local", restore="latest", control_endpoint=None)
    text = one_line(ei.value)
    assert str(bad) in text and "corrupt" in text and str(chks[-2]) in text, text
    with pytest.raises(RestoreError, match="corrupt"):  # an explicit restore of it names it too
        bounded(tmp_path).run(runtime="local", restore=str(newest), control_endpoint=None)


JOB = """
from sluice import CheckpointConfig, NoRestart, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.testing import TwoPhaseCommitTestSink

pipeline = Pipeline("hist", checkpoint=CheckpointConfig(interval=0.05, num_retained=3, storage={chk!r}),
                    restart=NoRestart())
pipeline.source(GeneratorSource(num_splits=2, records_per_split=1500, batch_size=50)).sink(
    TwoPhaseCommitTestSink({out!r}))
"""


@pytest.mark.parametrize("damage", ["lost metadata", "truncated metadata", "empty state file"])
def test_sluice_run_prints_the_refusal_as_one_line(tmp_path: Path, damage: str) -> None:
    chks = finished_job(tmp_path)
    if damage == "lost metadata":
        (chks[-1] / "_metadata").unlink()
    elif damage == "truncated metadata":
        (chks[-1] / "_metadata").write_text('{"checkpoint_id": ')
    else:
        newest = chks[-1]  # the state file its metadata names for subtask 0.0 (finished: 0-0.final.state)
        (newest / json.loads((newest / "_metadata").read_bytes())["tasks"]["0.0"]["path"]).write_bytes(b"")
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOB.format(chk=str(tmp_path / "chk"), out=str(tmp_path / "out"))))
    cmd = [sys.executable, "-m", "sluice.cli", "run", str(job), "--runtime", "local"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "Aborted" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and str(chks[-1]) in errors[0] and "--restore" in errors[0], r.stderr
    if damage != "empty state file":  # refused before the job starts (state files are read when it starts)
        assert r.stderr.strip() == errors[0], r.stderr


def test_a_copied_checkpoint_restores_from_its_new_place(tmp_path: Path) -> None:
    """The folder alone, copied elsewhere, the job's own storage gone: it restores (state paths in its
    metadata are relative to it)."""
    src_tmp = tmp_path / "first"
    src_tmp.mkdir()
    p = Pipeline(
        "copied", checkpoint=CheckpointConfig(interval=0.05, storage=str(src_tmp / "chk")), restart=NoRestart()
    )
    gen = GeneratorSource(num_splits=2, records_per_split=20000, batch_size=50, rows_per_second=4000)
    p.source(gen).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    wait_for_a_checkpoint(client)
    path = client.stop(savepoint=True, timeout=120).stopped_at  # the last checkpoint the output holds
    assert path is not None and "savepoint-" in path
    meta = json.loads((Path(path) / "_metadata").read_text())
    assert all(not h["path"].startswith("/") for h in meta["tasks"].values() if h.get("path")), meta["tasks"]
    copy = tmp_path / "elsewhere" / Path(path).name
    shutil.copytree(path, copy)
    shutil.rmtree(src_tmp)
    full = GeneratorSource(num_splits=2, records_per_split=20000, batch_size=50)
    again = Pipeline("copied", checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp_path / "chk2")))
    again.source(full).sink(TwoPhaseCommitTestSink(str(tmp_path / "out")))
    assert again.run(runtime="local", restore=str(copy), control_endpoint=None).status == "finished"
    assert committed(tmp_path) == list(range(40000))


def _cfg(tmp: Path, restore: str) -> JobConfig:
    return JobConfig(job_id="hist", checkpoint=CheckpointConfig(storage=str(tmp / "chk")), restore=restore)


def test_a_restart_never_goes_behind_what_its_run_completed(tmp_path: Path) -> None:
    chks = finished_job(tmp_path)
    st = checkpoint_storage(str(tmp_path / "chk"), "hist")
    newest = int(chks[-1].name.split("-")[1])
    run = RunRestore(floor=1, first=None, latest=newest)
    assert resolve_restore(_cfg(tmp_path, "none"), st, 1, run).checkpoint_id == newest  # type: ignore[union-attr]
    (chks[-1] / "_metadata").unlink()
    with pytest.raises(RestoreError, match=f"checkpoint {newest} .* is missing"):
        resolve_restore(_cfg(tmp_path, "none"), st, 1, run)


def test_a_restart_of_a_fresh_run_does_not_take_an_earlier_runs_checkpoint(tmp_path: Path) -> None:
    """restore='none' on a folder with an earlier run's checkpoints, a failure before the first checkpoint
    of this run: the restart starts empty again, as the user asked."""
    finished_job(tmp_path)
    st = checkpoint_storage(str(tmp_path / "chk"), "hist")
    run = RunRestore()
    assert resolve_restore(_cfg(tmp_path, "none"), st, 0, run) is None
    assert resolve_restore(_cfg(tmp_path, "none"), st, 1, run) is None


def test_a_cancel_that_does_not_retain_checkpoints_clears_the_history(tmp_path: Path) -> None:
    p = Pipeline(
        "gone",
        checkpoint=CheckpointConfig(interval=0.05, retain_on_cancel=False, storage=str(tmp_path / "chk")),
    )
    p.source(GeneratorSource(num_splits=1, records_per_split=10**6, batch_size=50, rows_per_second=5000)).sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out"))
    )
    client = p.start(runtime="local", restore="none", control_endpoint=None)
    wait_for_a_checkpoint(client)
    client.cancel()
    st = checkpoint_storage(str(tmp_path / "chk"), "gone")
    assert st.completed() == [] and (read_index(st) or {}).get("checkpoints") == []
    latest = JobConfig(job_id="gone", checkpoint=CheckpointConfig(storage=str(tmp_path / "chk")))
    assert resolve_restore(latest, st, 0) is None


def test_a_stats_line_cut_short_in_the_old_single_file_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()
    with open(tmp_path / "job" / LEGACY_STATS, "w") as f:
        f.write('{"checkpoint_id": 1, "status": "completed"}\n{"checkpoint_id": 2, "sta')  # an append cut short
    st = checkpoint_storage(str(tmp_path), "job")
    assert [r["checkpoint_id"] for r in st.read_stats()] == [1]


def old_format(job_dir: Path) -> list[dict[str, Any]]:
    """Turn a job's folder into what sluice wrote before issue 39: every stats record appended to one
    ``_stats.jsonl`` (the index and the checkpoint folders are unchanged)."""
    records = CheckpointStatsLog(checkpoint_storage(str(job_dir.parent), job_dir.name)).read()
    shutil.rmtree(job_dir / STATS_DIR)
    (job_dir / LEGACY_STATS).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return records


def test_a_folder_of_the_old_format_guards_and_restores_and_its_stats_move_into_segments(tmp_path: Path) -> None:
    chks = finished_job(tmp_path)
    job_dir = tmp_path / "chk" / "hist"
    records = old_format(job_dir)
    newest = int(chks[-1].name.split("-")[1])
    assert records[-1]["checkpoint_id"] == newest and records[-1]["status"] == "completed"
    # its single stats file is read: with the index gone, it alone names the lost newest checkpoint
    index = (job_dir / INDEX).read_bytes()
    (job_dir / INDEX).unlink()
    meta = (chks[-1] / "_metadata").read_bytes()
    (chks[-1] / "_metadata").unlink()
    with pytest.raises(RestoreError, match=f"checkpoint {newest} .*it has no _metadata"):
        bounded(tmp_path).run(runtime="local", restore="latest", control_endpoint=None)
    (job_dir / INDEX).write_bytes(index)
    (chks[-1] / "_metadata").write_bytes(meta)
    # undamaged, it restores; the first checkpoint of the new run moves the old records into a segment
    again = bounded(tmp_path).run(runtime="local", restore="latest", control_endpoint=None)
    assert again.status == "finished" and min(c.checkpoint_id for c in again.checkpoints) > newest
    assert not (job_dir / LEGACY_STATS).exists()
    kept = checkpoint_storage(str(tmp_path / "chk"), "hist").read_stats()
    assert kept[: len(records)] == records and kept[-1]["checkpoint_id"] == again.last_checkpoint


def test_the_stats_history_keeps_its_size_in_rolled_segments(tmp_path: Path) -> None:
    st = checkpoint_storage(str(tmp_path), "job")
    log = CheckpointStatsLog(st, history_size=30)
    for cid in range(1, 511):
        log.record({"checkpoint_id": cid, "status": "completed" if cid % 7 else "failed"})
    segments = sorted(p.name for p in (tmp_path / "job" / STATS_DIR).iterdir())
    assert len(segments) <= 3, segments  # 30 records: segments of 20, the newest one being written
    kept = [r["checkpoint_id"] for r in st.read_stats()]
    assert 30 <= len(kept) <= 49 and kept == list(range(511 - len(kept), 511)), kept
    # a new writer (the next attempt, a restarted process) goes on in the newest segment
    CheckpointStatsLog(st, history_size=30).record({"checkpoint_id": 511, "status": "completed"})
    assert [r["checkpoint_id"] for r in st.read_stats()][-2:] == [510, 511]
    assert sorted(p.name for p in (tmp_path / "job" / STATS_DIR).iterdir()) == segments
    # the newest records alone tell the newest completed checkpoint, also when failed ones follow it
    # into a new segment (then it is one segment back)
    again = CheckpointStatsLog(st, history_size=30)
    for cid in range(512, 532):
        again.record({"checkpoint_id": cid, "status": "failed"})
    newest = CheckpointStatsLog(st).newest()
    assert newest[-1]["checkpoint_id"] == 531 and len(newest) <= 40
    assert max(r["checkpoint_id"] for r in newest if r["status"] == "completed") == 511
