"""Checkpoint folder names and paths: ``<base>/<job-id>/chk-<n>`` or ``savepoint-<n>``."""

from __future__ import annotations

import os
import re

from sluice.errors import RestoreError

__all__ = ["CHECKPOINT_DIR", "parse_checkpoint_uri", "same_folder"]

#: a checkpoint's or savepoint's folder name; groups: kind, id
CHECKPOINT_DIR = re.compile(r"^(chk|savepoint)-(\d+)$")


def same_folder(a: str, b: str) -> bool:
    """Whether two checkpoint storage paths name the same folder (local paths resolved)."""

    def norm(p: str) -> str:
        p = p.rstrip("/")
        if "://" in p and not p.startswith("file://"):
            return p
        return os.path.realpath(p.removeprefix("file://"))

    return norm(a) == norm(b)


def parse_checkpoint_uri(uri: str) -> tuple[str, str, str]:
    """Split ``<base>/<job-id>/chk-<n>`` into (base, job id, checkpoint dir name)."""
    trimmed = uri.rstrip("/")
    parts = trimmed.rsplit("/", 2)
    if len(parts) != 3 or not CHECKPOINT_DIR.match(parts[2]):
        raise RestoreError(
            f"{uri!r} is not a checkpoint path (expected <base>/<job-id>/chk-<n> or savepoint-<n>)"
        )
    return parts[0], parts[1], parts[2]
