"""tests/listing.py: listing a folder a job writes to, while files and folders vanish under the listing."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import listing


class _Racing:
    """``os.scandir`` that lists a folder, then lets a writer act before the caller reads the entries: what
    a sink renaming a pending file at commit does between a test's listing and its ``stat``."""

    def __init__(self, real: Callable[[Any], Any], path: Any, writer: Callable[[str], None]) -> None:
        with real(path) as it:
            self.entries = list(it)
        writer(os.fspath(path))

    def __enter__(self) -> Iterator[os.DirEntry[str]]:
        return iter(self.entries)

    def __exit__(self, *exc: object) -> None:
        return None


def test_files_renamed_or_removed_between_listing_and_stat_are_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = tmp_path / "b=0"
    bucket.mkdir()
    pending = bucket / ".part-1.pending"
    pending.write_bytes(b"x" * 10)
    (bucket / "part-0.parquet").write_bytes(b"y" * 20)
    staged = tmp_path / "_staging"
    staged.mkdir()
    (staged / "f").write_bytes(b"z")

    def writer(folder: str) -> None:
        if folder == str(tmp_path):
            for f in staged.iterdir():  # a folder listed, then removed before it is entered
                f.unlink()
            staged.rmdir()
        elif folder == str(bucket):  # a file listed, then renamed before its stat
            pending.rename(bucket / "part-1.parquet")

    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: _Racing(real, path, writer))
    got = listing.files(tmp_path)
    assert {rel: st.st_size for rel, st in got.items()} == {"b=0/part-0.parquet": 20}
    monkeypatch.undo()
    # the renamed file is in the next listing, under its new name
    assert list(listing.files(tmp_path)) == ["b=0/part-0.parquet", "b=0/part-1.parquet"]


def test_only_visible_files_and_patterns(tmp_path: Path) -> None:
    for rel in ("k=1/part-a.parquet", "k=1/.part-b.parquet.pending", "_tmp/part-c.parquet", "part-d.jsonl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    assert list(listing.files(tmp_path, only_visible=True)) == ["k=1/part-a.parquet", "part-d.jsonl"]
    assert listing.file_paths(tmp_path, "*.parquet") == [tmp_path / "_tmp/part-c.parquet", tmp_path / "k=1/part-a.parquet"]
    assert listing.files(tmp_path / "missing") == {}
