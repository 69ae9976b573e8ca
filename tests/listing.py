"""Listing a folder that a running job may be writing to: the one helper every test uses to list output.

A sink renames and deletes files while it runs (a pending file renamed to its final name at commit, staged
files deleted after a merge, checkpoint folders retired), so a listing followed by a ``stat`` of each name
(``os.walk`` then ``os.stat``, ``Path.rglob`` then ``Path.stat``) races it: the name can be gone between
the two calls (``FileNotFoundError``), and ``Path.rglob`` itself raises when a folder vanishes under it.
:func:`files` lists with ``os.scandir`` and leaves out what vanished between the listing and its ``stat``: a
file renamed in between shows under its new name in a later listing, never as an error in this one.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path

__all__ = ["file_paths", "files", "visible"]


def visible(relative: str) -> bool:
    """Whether a reader (``pyarrow.dataset``'s default) sees the file: no part of its path relative to the
    listed root starts with ``.`` or ``_``."""
    return not any(part.startswith((".", "_")) for part in Path(relative).parts)


def files(root: str | os.PathLike[str], *, only_visible: bool = False) -> dict[str, os.stat_result]:
    """Every regular file under ``root`` by its path relative to ``root`` (``/``-separated), with its stat.

    Race-free against a writer: a folder or file that vanishes between being listed and being read is left
    out (a missing ``root`` gives ``{}``). ``only_visible`` keeps the files a reader sees (:func:`visible`).
    """
    base = os.fspath(root)
    out: dict[str, os.stat_result] = {}
    pending = [base]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed (or replaced by a file) since its parent was listed
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # renamed or deleted since the listing
            if not stat.S_ISREG(st.st_mode):
                continue
            rel = os.path.relpath(entry.path, base).replace(os.sep, "/")
            if not only_visible or visible(rel):
                out[rel] = st
    return dict(sorted(out.items()))


def file_paths(root: str | os.PathLike[str], pattern: str = "*", *, only_visible: bool = False) -> list[Path]:
    """The paths of :func:`files` whose file name matches ``pattern`` (``fnmatch``), sorted."""
    base = Path(root)
    return [
        base / rel
        for rel in files(root, only_visible=only_visible)
        if fnmatch.fnmatch(rel.rsplit("/", 1)[-1], pattern)
    ]
