"""Lost, corrupt, moved and wiped checkpoints, and restores of older ones, in front of committed output.

A first run is stopped (a regular checkpoint as its last, so every sink committed it) with three checkpoints
retained; then its checkpoints are damaged and the job run again:

* the newest ``_metadata`` lost, every ``_metadata`` lost, the newest ``_metadata`` truncated, a ``.state``
  file emptied: restore "latest" refuses with one line naming the checkpoint or the file, and writes nothing;
  an explicit restore of an older checkpoint (or of none) is refused too while the sink holds newer data,
  and with ``allow_reprocessing`` it runs and the output is what docs say: the input, plus once more what the
  sink held from checkpoints after the restored one;
* the newest checkpoint's folder copied elsewhere: it restores from there, output exactly once;
* the whole checkpoint storage wiped in front of the files, a Delta or an Iceberg table: the next run is
  refused before it writes; the table stays readable (its library and another engine) with exactly the
  committed rows; with ``allow_reprocessing`` the rerun adds the input once more under new file names;
* an older retained checkpoint restored into each sink: refused unless reprocessing is allowed, then as
  above.

A scenario counts as fired once its damage is verified on disk (the file really gone, truncated or empty).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sluice import Pipeline, RestoreError

from tests.faults.beyond import (
    SINKS,
    UNHANDLED_THREAD_ERRORS_FAIL,
    Input,
    Output,
    check_exactly_once,
    completed,
    log_scenario,
    pipeline,
    wait_until,
)
from tests.faults.contract import ALLOW_REPROCESSING, checkpoint_config, missing, one_line, run_options

pytestmark = UNHANDLED_THREAD_ERRORS_FAIL

ROOT = Path(__file__).resolve().parent.parent.parent
SLOW = Input(per_split=1500, rate=300.0)  # the first run: stopped while it reads
FAST = Input(per_split=1500, rate=None)  # the same rows, as fast as possible (reruns)


def job(name: str, inp: Input, out: Output, chk: Path) -> Pipeline:
    cc = checkpoint_config(interval=0.1, storage=str(chk), num_retained=3, storage_retry_timeout=1.0)
    return pipeline(name, inp, out, cc)


def first_run(name: str, out: Output, chk: Path) -> int:
    """Run until four checkpoints completed, stop with a regular checkpoint; returns its id (the newest)."""
    client = job(name, SLOW, out, chk).start(runtime="local", restore="none", control_endpoint=None)
    wait_until(lambda: completed(client) >= 4, "four completed checkpoints", client)
    result = client.stop(savepoint=False)
    assert result.status == "stopped" and result.stopped_at, f"{name}: the first run did not stop: {result}"
    newest = int(result.stopped_at.rstrip("/").rsplit("chk-", 1)[1])
    assert (chk / name / f"chk-{newest - 2}" / "_metadata").exists(), "three checkpoints are not retained"
    assert out.ids(), f"{name}: the first run committed nothing"
    return newest


def refused(
    p: Pipeline, out: Output, restore: str, *names: str, allow: bool = False
) -> str:
    """Run ``p`` restoring ``restore``: it must refuse in one line naming ``names`` and write nothing."""
    files, ids = out.data_files(), out.ids()
    try:
        result = p.run(runtime="local", restore=restore, control_endpoint=None, **run_options(allow))
    except Exception as exc:
        text = one_line(exc, *names)
    else:
        raise AssertionError(
            f"restore={restore!r} was not refused: the job {result.status} and the output holds "
            f"{len(out.ids())} rows (before: {len(ids)}){missing()}"
        )
    assert out.data_files() == files, f"the refused run wrote to the output: {text}"
    assert out.ids() == ids
    return text


def reprocess(name: str, out: Output, chk: Path, restore: str, restored_id: int, family: str) -> None:
    """Restore ``restore`` (checkpoint ``restored_id``, 0 for none): refused while the sink holds newer
    data; with reprocessing allowed the output is the input plus what the sink held after ``restored_id``."""
    held = out.ids_by_checkpoint(name)
    again = sorted(i for cid, ids in held.items() if cid > restored_id for i in ids)
    expected = sorted(FAST.ids + again)
    if again:
        refused(job(name, FAST, out, chk), out, restore, ALLOW_REPROCESSING)
    result = job(name, FAST, out, chk).run(
        runtime="local", restore=restore, control_endpoint=None, **run_options(True)
    )
    got = out.ids()
    log_scenario(family, f"{name}-reprocess", out.kind, True, got, expected)
    assert result.status == "finished", f"{name}: {result.status}"
    check_exactly_once(f"{name}: restore {restore} with reprocessing ({len(again)} rows again)", got, expected)
    if out.kind != "files":
        check_exactly_once(f"{name} (read by another engine)", out.ids_independently(), expected)


# -- lost and corrupt checkpoint files ---------------------------------------------------------------------
def lose_newest_metadata(d: Path, n: int) -> tuple[list[str], bool]:
    (d / f"chk-{n}" / "_metadata").unlink()
    return [f"chk-{n}"], not (d / f"chk-{n}" / "_metadata").exists()


def lose_every_metadata(d: Path, n: int) -> tuple[list[str], bool]:
    for m in d.glob("chk-*/_metadata"):
        m.unlink()
    return [f"chk-{n}"], not list(d.glob("chk-*/_metadata"))


def truncate_newest_metadata(d: Path, n: int) -> tuple[list[str], bool]:
    meta = d / f"chk-{n}" / "_metadata"
    data = meta.read_bytes()
    meta.write_bytes(data[: len(data) // 2])
    return [f"chk-{n}/_metadata"], meta.stat().st_size == len(data) // 2 > 0


def empty_a_state_file(d: Path, n: int) -> tuple[list[str], bool]:
    state = sorted((d / f"chk-{n}").glob("*.state"))[0]
    state.write_bytes(b"")
    return [f"chk-{n}/{state.name}"], state.stat().st_size == 0


DAMAGE: dict[str, Callable[[Path, int], tuple[list[str], bool]]] = {
    "lost-newest-metadata": lose_newest_metadata,
    "lost-every-metadata": lose_every_metadata,
    "truncated-metadata": truncate_newest_metadata,
    "empty-state": empty_a_state_file,
}


@pytest.mark.faults
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_newest_checkpoint_is_refused_by_name_then_an_older_one_restores_on_purpose(
    tmp_path: Path, damage: str
) -> None:
    name = f"loss-{damage}"
    out, chk = Output("files", str(tmp_path / "out")), tmp_path / "chk"
    newest = first_run(name, out, chk)
    names, fired = DAMAGE[damage](chk / name, newest)
    assert fired, f"{damage}: the damage is not on disk"
    before = out.ids()
    refused(job(name, FAST, out, chk), out, "latest", *names)
    log_scenario("lost-checkpoint", damage, "files", fired, out.ids(), before)
    if damage == "lost-every-metadata":
        reprocess(name, out, chk, "none", 0, "lost-checkpoint")
    else:
        older = newest - 1
        reprocess(name, out, chk, str(chk / name / f"chk-{older}"), older, "lost-checkpoint")


CLI_JOB = """
import os
from pathlib import Path

from tests.faults.beyond import Output
from tests.faults.test_checkpoint_loss import FAST, job

pipeline = job(os.environ["JOB_NAME"], FAST, Output("files", os.environ["JOB_OUT"]), Path(os.environ["JOB_CHK"]))
"""


@pytest.mark.faults
@pytest.mark.parametrize("damage", ["truncated-metadata", "empty-state"])
def test_sluice_run_prints_the_refusal_as_one_line_naming_the_file(tmp_path: Path, damage: str) -> None:
    """``sluice run`` on a corrupt newest checkpoint: one ``Error:`` line naming the file, no traceback and
    no bare ``Aborted!`` (issue 21: a JSONDecodeError traceback, and ``Aborted!`` for an empty .state)."""
    name = f"cli-{damage}"
    out, chk = Output("files", str(tmp_path / "out")), tmp_path / "chk"
    newest = first_run(name, out, chk)
    names, fired = DAMAGE[damage](chk / name, newest)
    files, ids = out.data_files(), out.ids()
    (tmp_path / "job.py").write_text(CLI_JOB)
    env = {**os.environ, "JOB_NAME": name, "JOB_OUT": out.root, "JOB_CHK": str(chk)}
    cmd = [sys.executable, "-m", "sluice.cli", "run", str(tmp_path / "job.py"), "--runtime", "local"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    text = r.stdout + r.stderr
    log_scenario("lost-checkpoint", f"cli-{damage}", "files", fired, out.ids(), ids)
    assert r.returncode != 0, f"sluice run did not refuse:\n{text}{missing()}"
    clear = "Traceback" not in text and "Aborted!" not in text.splitlines()
    assert clear, f"not a clear refusal:\n{text}"
    naming = [line for line in text.splitlines() if all(n in line for n in names)]
    assert len(naming) == 1 and naming[0].startswith("Error:"), f"no one-line refusal naming {names}:\n{text}"
    assert out.data_files() == files, "the refused run wrote to the output"


@pytest.mark.faults
def test_checkpoint_folder_copied_elsewhere_restores_from_there(tmp_path: Path) -> None:
    name = "loss-moved"
    out, chk = Output("files", str(tmp_path / "out")), tmp_path / "chk"
    newest = first_run(name, out, chk)
    moved = tmp_path / "elsewhere" / name / f"chk-{newest}"
    shutil.copytree(chk / name / f"chk-{newest}", moved)
    shutil.rmtree(chk)
    fired = moved.joinpath("_metadata").exists() and not chk.exists()
    result = job(name, FAST, out, tmp_path / "chk2").run(runtime="local", restore=str(moved), control_endpoint=None)
    got = out.ids()
    log_scenario("lost-checkpoint", "moved", "files", fired, got, FAST.ids)
    assert result.status == "finished"
    check_exactly_once("restored from a copied checkpoint folder", got, FAST.ids)


# -- wiped storage and older checkpoints in front of committed output ------------------------------------
@pytest.mark.faults
@pytest.mark.parametrize("sink", SINKS)
def test_wiped_checkpoint_storage_is_refused_before_writing(tmp_path: Path, sink: str) -> None:
    name = f"wiped-{sink}"
    out, chk = Output(sink, str(tmp_path / "out")), tmp_path / "chk"
    result = job(name, FAST, out, chk).run(runtime="local", restore="none", control_endpoint=None)
    assert result.status == "finished"
    check_exactly_once(f"{name}: the first run", out.ids(), FAST.ids)
    shutil.rmtree(chk)
    fired = not chk.exists()
    refused(job(name, FAST, out, chk), out, "latest", ALLOW_REPROCESSING)
    got = out.ids()
    log_scenario("wiped-checkpoints", name, sink, fired, got, FAST.ids)
    check_exactly_once(f"{name}: after the refusal", got, FAST.ids)
    check_exactly_once(f"{name}: after the refusal (another reader)", out.ids_independently(), FAST.ids)
    reprocess(name, out, chk, "latest", 0, "wiped-checkpoints")


@pytest.mark.faults
@pytest.mark.parametrize("sink", SINKS)
def test_restoring_an_older_retained_checkpoint_is_refused_unless_reprocessing_is_allowed(
    tmp_path: Path, sink: str
) -> None:
    name = f"older-{sink}"
    out, chk = Output(sink, str(tmp_path / "out")), tmp_path / "chk"
    newest = first_run(name, out, chk)
    older = newest - 2
    path = chk / name / f"chk-{older}"
    assert out.ids_by_checkpoint(name).keys() - set(range(older + 1)), f"{name}: the sink holds nothing newer"
    reprocess(name, out, chk, str(path), older, "older-restore")


def test_refusals_are_restore_errors() -> None:
    """The tier's refusal check accepts sluice errors only (a raw traceback is not a refusal)."""
    one_line(RestoreError("checkpoint chk-3 is missing"), "chk-3")
    with pytest.raises(AssertionError):
        one_line(ValueError("Expecting value: line 1 column 1 (char 0)"))
    with pytest.raises(AssertionError):
        one_line(RestoreError("two\nlines"))
