"""The running-jobs registry on every checkpoint storage, and token files."""

from __future__ import annotations

from pathlib import Path

import pytest
from sluice import ConfigError
from sluice.checkpoint.storage_loader import checkpoint_storage
from sluice.control.client import ControlError, find_job
from sluice.control.registry import RegistryEntry, parse_address, read_entries, token_path, write_token

from tests.sinks.conftest import MotoS3


@pytest.mark.s3
def test_registry_entries_on_s3(moto_s3: MotoS3, tmp_path: Path) -> None:
    uri = f"s3://{moto_s3.new_bucket()}/checkpoints"
    storage = checkpoint_storage(uri, "orders", **moto_s3.options())
    token = "t" * 43
    entry = RegistryEntry.new("orders", "http://127.0.0.1:1234", "spark", str(tmp_path / "t.token"), token)
    entry.write(storage)
    (found,) = read_entries(uri, moto_s3.options())
    assert found == entry and found.running and found.authentic(token)
    entry.ended("stopped", token).write(storage)  # rewritten, never deleted: every storage can do that
    (found,) = read_entries(uri, moto_s3.options())
    assert not found.running and found.status == "stopped" and found.authentic(token)
    assert token_path(storage) == Path.home() / ".sluice" / "tokens" / "orders.token"  # never on S3


def test_token_files_are_private_and_fresh(tmp_path: Path) -> None:
    storage = checkpoint_storage(str(tmp_path / "chk"), "job")
    path = token_path(storage)
    assert path == tmp_path / "chk" / "job" / "_control.token"
    path.parent.mkdir(parents=True)
    path.write_text("left by an earlier run")
    path.chmod(0o644)
    token = write_token(path)
    assert path.read_text() == token and len(token) >= 40 and path.stat().st_mode & 0o777 == 0o600
    assert write_token(path) != token


def test_addresses() -> None:
    assert parse_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_address("[::1]:8081") == ("::1", 8081)
    for bad in ("8081", "host:", ":80", "h:99999", "h:x"):
        with pytest.raises(ConfigError, match="expected HOST:PORT"):
            parse_address(bad)


def test_a_job_is_found_without_its_id_when_it_is_the_only_one(tmp_path: Path) -> None:
    """`sluice status` (and the other verbs) without JOB: the one running job, or which ones to pick from."""
    uri = str(tmp_path / "chk")
    with pytest.raises(ControlError, match=r"no job runs in the registry of .*: pass --storage"):
        find_job(None, uri)
    for n, job in enumerate(["orders", "clicks"]):
        (tmp_path / "chk" / job / "chk-1").mkdir(parents=True)  # a job's folder holds checkpoints
        entry = RegistryEntry.new(job, f"http://127.0.0.1:{1234 + n}", "local", str(tmp_path / "t.token"), "t" * 43)
        entry.write(checkpoint_storage(uri, job))
        if n == 0:
            assert find_job(None, uri).job_id == "orders"
    with pytest.raises(ControlError, match=r"2 jobs run in the registry of .* \(clicks, orders\): name one as JOB"):
        find_job(None, uri)
    assert find_job("clicks", uri).url == "http://127.0.0.1:1235"
