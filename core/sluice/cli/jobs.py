"""``sluice jobs``: the jobs running on a checkpoint storage, from its registry, with their live status."""

from __future__ import annotations

from typing import Any

import click

from sluice.cli.endpoint import emit_json, fmt_duration, print_table, storage_option
from sluice.cli.main import main
from sluice.control.client import ControlClient, ControlError, check_entry
from sluice.control.registry import RegistryEntry, read_entries, read_token

__all__ = ["jobs"]


def _live(entry: RegistryEntry, storage: str) -> dict[str, Any]:
    try:
        token = read_token(entry.token_file)
    except OSError as exc:
        return {"status": "unknown", "error": f"cannot read the token file: {exc.strerror}"}
    except UnicodeDecodeError:
        return {"status": "unknown", "error": "the token file is not text"}
    try:
        check_entry(entry, token, storage)  # the token goes only where the job itself registered
    except ControlError as exc:
        return {"status": "unverified", "error": str(exc)}
    try:
        return ControlClient(entry.url, token).get("/api/v1/job", timeout=5.0)  # type: ignore[no-any-return]
    except ControlError as exc:
        return {"status": "unreachable", "error": str(exc)}


def _ended(e: RegistryEntry) -> dict[str, Any]:
    """What the registry says of a job that ended (its endpoint is gone): ``up`` is how long it ran."""
    last = {"checkpoint_id": e.last_checkpoint} if e.last_checkpoint is not None else None
    return {
        "status": e.status,
        "attempt": e.attempt,
        "restarts": e.attempt,
        "uptime_s": None if e.ended_at is None else e.ended_at - e.started_at,
        "last_checkpoint": last,
    }


@main.command()
@storage_option
@click.option("--all", "show_all", is_flag=True, help="Also list jobs that ended (as their registry entry says).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def jobs(storage: str, show_all: bool, as_json: bool) -> None:
    """List the jobs that run with checkpoint storage STORAGE (each job registers there while it runs)."""
    rows: list[dict[str, Any]] = []
    for e in sorted(read_entries(storage), key=lambda e: e.job_id):
        if not e.running and not show_all:
            continue
        live: dict[str, Any] = _live(e, storage) if e.running else _ended(e)
        last: dict[str, Any] = live.get("last_checkpoint") or {}
        rows.append(
            {
                "job_id": e.job_id,
                "status": live.get("status"),
                "runtime": e.runtime,
                "attempt": live.get("attempt"),
                "restarts": live.get("restarts"),
                "uptime_s": live.get("uptime_s"),
                "last_checkpoint": last.get("checkpoint_id"),
                "url": e.url,
                "pid": e.pid,
                "host": e.host,
                "error": live.get("error"),
            }
        )
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo(f"no running jobs registered in {storage}")
        return
    print_table(
        ["job", "status", "runtime", "attempt", "up", "last checkpoint", "endpoint", "pid@host"],
        [
            [
                r["job_id"],
                r["status"],
                r["runtime"],
                "-" if r["attempt"] is None else r["attempt"],
                fmt_duration(r["uptime_s"]),
                "-" if r["last_checkpoint"] is None else r["last_checkpoint"],
                r["url"],
                f"{r['pid']}@{r['host']}",
            ]
            for r in rows
        ],
    )
