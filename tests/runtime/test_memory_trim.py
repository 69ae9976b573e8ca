"""Freed heap memory goes back to the system after a burst (issue 39: a first process that caught up a
backlog kept ~100 MB of free chunks in glibc's arenas for good, and settled that much above its restarted
peers). In a process of its own: a burst of ~200 MB of small allocations is freed except one block allocated
last (so the heap's top cannot shrink); glibc keeps the memory until the trimming thread gives it back."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = """
import sys, time
import sluice.runtime.memory as memory

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) >> 10 for x in f if x.startswith("VmRSS"))

memory.CHECK_EVERY_S = 0.2
trims = []
real_trim = memory.trim
memory.trim = lambda: trims.append(1) or real_trim()
burst = [bytes(2000) + bytes([i % 256]) for i in range(100_000)]  # ~200 MB of 2 KB chunks (malloc, not mmap)
pin = bytearray(4000)  # allocated last: the top of the heap stays in use
peak = rss_mb()
del burst
kept = memory.free_kept_bytes() >> 20
after_free = rss_mb()
if sys.argv[1] == "trimmer":
    memory.start_trimmer()
deadline = time.monotonic() + 30
while rss_mb() > peak - 100 and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(2)  # ten more looks: the memory stays free, nothing to trim again
print(peak, kept, after_free, rss_mb(), len(trims), flush=True)
"""


def run(mode: str) -> tuple[int, ...]:
    code = textwrap.dedent(CHILD)
    env = {"SLUICE_MALLOC_TRIM_MB": "64" if mode == "trimmer" else "0", "PATH": "/usr/bin:/bin"}
    if mode == "idle":
        code = code.replace("deadline = time.monotonic() + 30", "deadline = time.monotonic() + 2")
    r = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return tuple(int(x) for x in r.stdout.split())


def test_memory_freed_after_a_burst_goes_back_to_the_system() -> None:
    peak, kept, after_free, end, trims = run("idle")
    # without a trim glibc keeps it: the burst's memory is free in its arenas, and still resident
    assert kept > 150 and after_free > peak - 50 and end > peak - 50 and trims == 0, (peak, kept, after_free, end)
    peak, kept, after_free, end, trims = run("trimmer")
    assert kept > 150 and end < peak - 150, (peak, kept, after_free, end)
    assert trims == 1, f"{trims} trims: the trimmed pages still count as free, and must not be trimmed again"
