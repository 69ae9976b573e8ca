"""Run every quirk script on one broker (``--broker tansu|apache``), one after the other, each in a process
of its own; prints each script's output under its name and exits non-zero if one failed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from _broker import parse

HERE = Path(__file__).resolve().parent
#: long or optional ones last: throughput takes minutes, quix_describe_configs needs sluice-etl[bench]
LAST = ("concurrent_transactions.py", "throughput.py", "quix_describe_configs.py")


def main() -> None:
    args = parse(__doc__, lambda p: p.add_argument("--skip", nargs="*", default=[], help="scripts to leave out"))
    scripts = sorted(p.name for p in HERE.glob("*.py") if not p.name.startswith("_") and p.name != "run_all.py")
    scripts = [s for s in scripts if s not in LAST] + [s for s in LAST if s in scripts]
    failed = []
    for name in scripts:
        if name in args.skip or name.removesuffix(".py") in args.skip:
            continue
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, str(HERE / name), "--broker", args.broker], capture_output=True, text=True)
        print(f"=== {name} --broker {args.broker} (exit {r.returncode}, {time.monotonic() - t0:.0f} s)")
        print((r.stdout + (r.stderr if r.returncode else "")).rstrip(), flush=True)
        if r.returncode:
            failed.append(name)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
