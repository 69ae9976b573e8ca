"""Compose healthchecks for the Spark containers (standard library only).

    python3 healthcheck.py master   # the master's UI answers and the master is ALIVE
    python3 healthcheck.py worker   # the master lists this worker (--host = $HOSTNAME) as ALIVE

A worker is healthy only once it has registered with the master, so the job (whose barrier stage needs all
its slots at once) is submitted after every worker's cores are available.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.request

MASTER_UI = os.environ.get("SPARK_MASTER_UI", "http://spark-master:8080")


def master_state(url: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{url.rstrip('/')}/json/", timeout=5) as r:
        state: dict[str, object] = json.load(r)
    return state


def main(role: str) -> int:
    if role == "master":
        state = master_state("http://localhost:8080")
        return 0 if state.get("status") == "ALIVE" else 1
    if role == "worker":
        host = os.environ.get("HOSTNAME") or socket.gethostname()
        workers = master_state(MASTER_UI).get("workers", [])
        alive = [w for w in workers if isinstance(w, dict) and w.get("state") == "ALIVE"]
        return 0 if any(w.get("host") == host for w in alive) else 1
    print(f"usage: {sys.argv[0]} master|worker", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ""))
    except OSError as exc:  # not up yet: unhealthy, not a crash
        print(exc, file=sys.stderr)
        sys.exit(1)
