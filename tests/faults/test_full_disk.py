"""A full disk (a size-limited tmpfs, tests/faults/disk.py) under checkpoint storage and sink output.

* full while the job runs: checkpoints and sink writes fail with ENOSPC; the job fails over (or declines
  checkpoints) while the disk stays full, and once space is freed it completes exactly once, leaving nothing
  behind: no folders of declined checkpoints, no temporary or empty files, a registry entry marked ended.
* full before the job starts: the checkpoint location is checked at start and refused with one line naming
  it, no restart spent, nothing left behind; after freeing space the job runs exactly once.

The fault counts as fired only if the job reported ENOSPC (a failed attempt or checkpoint saying so) while
the disk was full.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from sluice import FixedDelayRestart, JobClient, Pipeline

from tests.faults.beyond import (
    SINKS,
    UNHANDLED_THREAD_ERRORS_FAIL,
    Input,
    Output,
    check_exactly_once,
    completed,
    leftovers,
    log_scenario,
    pipeline,
    wait_until,
)
from tests.faults.contract import checkpoint_config, missing, one_line
from tests.faults.disk import SmallDisk

pytestmark = UNHANDLED_THREAD_ERRORS_FAIL

NO_SPACE = re.compile(r"(?i)no space left|errno 28|os error 28|disk is full|ENOSPC")


def enospc_reports(client: JobClient) -> int:
    """Failed attempts and failed checkpoints of the job that report a full disk."""
    texts = [f["error"] for f in client.monitor.failures()]
    texts += [c.failure_detail or "" for c in client.monitor.checkpoints() if c.status == "failed"]
    return sum(1 for t in texts if NO_SPACE.search(t))


def disk_job(
    disk: SmallDisk, sink: str, name: str, inp: Input, attempts: int = 20
) -> tuple[Output, Path, Pipeline]:
    out = Output(sink, str(disk.path / "out"))
    chk = disk.path / "chk"
    cc = checkpoint_config(interval=0.1, storage=str(chk), storage_retry_timeout=0.5)
    return out, chk, pipeline(name, inp, out, cc, FixedDelayRestart(attempts=attempts, delay=0.2))


@pytest.mark.faults
@pytest.mark.parametrize("sink", SINKS)
def test_full_disk_while_running_fails_over_then_completes_exactly_once(
    small_disk: Callable[[str], SmallDisk], sink: str
) -> None:
    disk: SmallDisk = small_disk("24m")
    inp = Input(per_split=1000, rate=300.0)
    out, chk, p = disk_job(disk, sink, f"disk-{sink}", inp)
    client: JobClient = p.start(runtime="local", restore="none", control_endpoint="127.0.0.1:0")
    wait_until(lambda: completed(client) >= 2, "two checkpoints before the disk fills", client)
    disk.fill()
    try:
        wait_until(lambda: enospc_reports(client) > 0, "the job to report the full disk", client, 60)
        # keep it full a little longer: through a restart, or a second failure
        wait_until(lambda: client.monitor.attempts > 1 or enospc_reports(client) > 1, "a second failure", client, 30)
    finally:
        disk.free()
    fired = enospc_reports(client) > 0
    error: BaseException | None = None
    try:
        result = client.wait(300)
    except BaseException as exc:
        error, result = exc, None
    got = out.ids()
    label = f"{sink}: full disk ({enospc_reports(client)} ENOSPC reports, {client.monitor.attempts} attempts)"
    log_scenario("full-disk", f"running-{sink}", sink, fired, got, inp.ids)
    assert error is None and result is not None, f"{label}: the job failed: {error}{missing()}"
    assert result.status == "finished", f"{label}: {result.status}"
    check_exactly_once(label, got, inp.ids)
    if sink != "files":
        check_exactly_once(f"{label} (read by another engine)", out.ids_independently(), inp.ids)
    left = leftovers(chk, Path(out.files_root) if sink == "files" else None)
    assert not left, f"{label}: left behind:\n" + "\n".join(left)


@pytest.mark.faults
def test_full_disk_at_start_is_refused_in_one_line_then_runs_once_freed(small_disk: Callable[[str], SmallDisk]) -> None:
    disk: SmallDisk = small_disk("8m")
    inp = Input(per_split=300, rate=None)
    out, chk, p = disk_job(disk, "files", "disk-at-start", inp)
    disk.fill()
    error: BaseException | None = None
    client: JobClient | None = None
    try:  # refused when the job is started, or when it runs
        client = p.start(runtime="local", restore="none", control_endpoint="127.0.0.1:0")
        client.wait(120)
    except BaseException as exc:
        error = exc
    attempts = client.monitor.attempts if client is not None else 0
    left = leftovers(chk, Path(out.files_root))
    disk.free()
    assert error is not None, "the job ran on a full disk"
    fired = NO_SPACE.search(f"{error} {error.__cause__}") is not None
    log_scenario("full-disk", "at-start", "files", fired, out.ids(), [])
    one_line(error, str(chk))
    assert attempts <= 1, f"{attempts} attempts spent on a checkpoint location that cannot be written: {error}"
    assert not left, "a refused start left behind:\n" + "\n".join(left)
    result = p.run(runtime="local", restore="none", control_endpoint=None)
    assert result.status == "finished"
    check_exactly_once("after freeing space", out.ids(), inp.ids)
    assert not leftovers(chk, Path(out.files_root))


@pytest.mark.faults
@pytest.mark.parametrize("sink", SINKS)
def test_disk_full_until_the_job_fails_leaves_nothing_behind_and_the_rerun_completes(
    small_disk: Callable[[str], SmallDisk], sink: str
) -> None:
    """The disk stays full until the restart budget is spent: the job fails naming the full disk, leaves no
    declined checkpoint folders, temporary files or live registry entry; once space is freed the next run
    resumes the latest checkpoint and the output is exactly the input."""
    disk: SmallDisk = small_disk("24m")
    inp = Input(per_split=1000, rate=300.0)
    out, chk, p = disk_job(disk, sink, f"disk-fails-{sink}", inp, attempts=1)
    client: JobClient = p.start(runtime="local", restore="none", control_endpoint="127.0.0.1:0")
    wait_until(lambda: completed(client) >= 2, "two checkpoints before the disk fills", client)
    disk.fill()
    error: BaseException | None = None
    try:
        client.wait(300)
    except BaseException as exc:
        error = exc
    finally:  # the sink's staged files wait for the next run's recovery; the job's own records may not
        left = leftovers(chk)
        disk.free()
    fired = enospc_reports(client) > 0
    label = f"{sink}: disk full until the job failed ({enospc_reports(client)} ENOSPC reports)"
    assert error is not None, f"{label}: the job finished on a full disk"
    assert NO_SPACE.search(str(error)), f"{label}: the error does not name the full disk: {error}"
    assert not left, f"{label}: left behind:\n" + "\n".join(left)
    result = p.run(runtime="local", restore="latest", control_endpoint=None)
    got = out.ids()
    log_scenario("full-disk", f"until-failed-{sink}", sink, fired, got, inp.ids)
    assert fired, f"{label}: the job never reported ENOSPC"
    assert result.status == "finished", f"{label}: {result.status}"
    check_exactly_once(label, got, inp.ids)
    assert not leftovers(chk, Path(out.files_root) if sink == "files" else None)
