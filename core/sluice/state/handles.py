"""The files a keyed state handle references, whatever its format, and how many bytes it persisted.

A handle is ``native`` (RocksDB: ``shared`` files, reused ones marked ``placeholder``, and ``private``
ones), ``canonical`` (``files`` per key group, or ``groups`` inline in the task state file) or
``changelog`` (a ``base`` handle of one of those formats plus ``segments`` of changes,
:mod:`sluice.state.changelog`).
"""

from __future__ import annotations

from typing import Any

from sluice.state.transfer import FileRef

__all__ = ["handle_files", "persisted_bytes", "total_bytes"]


def handle_files(handle: dict[str, Any]) -> list[tuple[FileRef, bool]]:
    """Every file ``handle`` references, with whether it reuses an earlier checkpoint's upload
    (a placeholder)."""
    fmt = handle.get("format")
    out: list[tuple[FileRef, bool]] = []
    if fmt == "native":
        out += [(FileRef.from_plain(r), bool(r.get("placeholder"))) for r in (handle.get("shared") or {}).values()]
        out += [(FileRef.from_plain(r), False) for r in (handle.get("private") or {}).values()]
    elif fmt == "canonical":
        out += [(FileRef.from_plain(r), False) for r in (handle.get("files") or {}).values()]
    elif fmt == "changelog":
        base = handle.get("base")
        if base:
            confirmed = bool(base.get("confirmed"))
            out += [(ref, confirmed or placeholder) for ref, placeholder in handle_files(base["handle"])]
        out += [(FileRef.from_plain(s), bool(s.get("placeholder"))) for s in handle.get("segments") or []]
    return out


def _inline_bytes(handle: dict[str, Any]) -> int:
    if handle.get("format") == "changelog":
        base = handle.get("base")
        return _inline_bytes(base["handle"]) if base else 0
    return sum(len(v) for v in (handle.get("groups") or {}).values())


def persisted_bytes(handle: dict[str, Any]) -> int:
    """Bytes this checkpoint wrote: the files it uploaded (not the ones it reuses) and inline groups."""
    return _inline_bytes(handle) + sum(ref.size for ref, placeholder in handle_files(handle) if not placeholder)


def total_bytes(handle: dict[str, Any]) -> int:
    """Bytes of everything the handle references: what a restore reads."""
    return _inline_bytes(handle) + sum(ref.size for ref, _ in handle_files(handle))
