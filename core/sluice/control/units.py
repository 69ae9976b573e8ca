"""How numbers, byte sizes and durations are written for people: the CLI's tables, ``sluice run``'s progress."""

from __future__ import annotations

__all__ = ["fmt_bytes", "fmt_duration", "fmt_number"]


def fmt_number(n: float | None) -> str:
    """``1.2M``, ``3.4k``, ``12``, ``0.5``; ``-`` for None."""
    if n is None:
        return "-"
    for unit, div in (("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}" if abs(n) >= 10 or n == int(n) else f"{n:.1f}"


def fmt_bytes(n: float | None) -> str:
    """``904 B``, ``3.0 KiB``, ... (None counts as 0)."""
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_duration(s: float | None) -> str:
    """``15ms``, ``2.5s``, ``3m05s``, ``1h02m``; ``-`` for None."""
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"
