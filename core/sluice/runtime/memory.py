"""Freed heap memory given back to the operating system (glibc).

glibc's ``malloc`` keeps what a process frees in its arenas for reuse and returns memory to the system only
from the top of a heap. After a burst (a job catching up a backlog reads and decodes at full speed) a
process can keep a hundred MB of free memory for good: in issue 39 a first process that caught up a minute
of backlog settled ~100 MB of RSS above its restarted peers holding the same live data, and glibc's own
figures showed why: 130 MB of free chunks kept in its arenas against 45 MB in the restarted processes.
``malloc_trim(0)`` releases free pages wherever they are in the heap (``madvise``); it brought that process
down to its peers' level at once (361 -> 256 MB, 77 ms on a loaded machine).

So a daemon thread per process (:func:`start_trimmer`, called when the first task starts: in the local
runtime's process and in every Spark slot's) reads every :data:`CHECK_EVERY_S` seconds how much free memory
malloc keeps (``mallinfo2``) and trims when that grew by more than ``$SLUICE_MALLOC_TRIM_MB`` (default 64;
0 turns it off) over its lowest level since the last trim (trimmed pages still count as free, so the level
itself says nothing after a trim). In steady state it moves by less, so trims follow bursts only. Without
glibc (musl, macOS) nothing is started.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
import time
from typing import Any

__all__ = ["CHECK_EVERY_S", "free_kept_bytes", "start_trimmer", "trim"]

log = logging.getLogger("sluice.runtime")

#: seconds between looks at malloc's free memory
CHECK_EVERY_S = 30.0
_DEFAULT_THRESHOLD_MB = 64

_started = False
_guard = threading.Lock()


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")
    ]  # fmt: skip


def _libc() -> Any | None:
    """glibc with ``mallinfo2`` and ``malloc_trim`` (2.33 or later), or None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def free_kept_bytes() -> int | None:
    """Free bytes malloc keeps in its arenas (``mallinfo2().fordblks``), or None without glibc."""
    return None if _LIBC is None else int(_LIBC.mallinfo2().fordblks)


def trim() -> bool:
    """Give malloc's free pages back to the system now; whether glibc did (False without it)."""
    return _LIBC is not None and bool(_LIBC.malloc_trim(0))


def _threshold() -> int:
    raw = os.environ.get("SLUICE_MALLOC_TRIM_MB", "")
    try:
        return max(0, int(raw)) << 20 if raw.strip() else _DEFAULT_THRESHOLD_MB << 20
    except ValueError:
        log.warning("SLUICE_MALLOC_TRIM_MB=%r is not an integer (MB, 0 = off); using %d", raw, _DEFAULT_THRESHOLD_MB)
        return _DEFAULT_THRESHOLD_MB << 20


def start_trimmer() -> None:
    """Start this process's trimming thread, once (nothing without glibc or with the threshold 0)."""
    global _started
    with _guard:
        if _started:
            return
        _started = True
    threshold = _threshold()
    if _LIBC is None or threshold == 0:
        return
    threading.Thread(target=_loop, args=(threshold,), name="sluice-malloc-trim", daemon=True).start()


def _loop(threshold: int) -> None:
    low = 0  # the least free memory malloc kept since the last trim
    while True:
        time.sleep(CHECK_EVERY_S)
        try:
            kept = free_kept_bytes() or 0
            low = min(low, kept)
            if kept - low > threshold:
                t = time.perf_counter()
                trim()
                low = kept
                log.debug("gave up to %d MB of freed heap memory back (%.0f ms)", kept >> 20,
                          (time.perf_counter() - t) * 1e3)  # fmt: skip
        except Exception as exc:  # never fatal: memory is only kept longer
            log.debug("malloc_trim failed: %s", exc)
