"""What the cluster can offer a job: task slots (refuse what can never fit, wait for what will) and addresses.

**Slots.** A barrier stage of S tasks needs S task slots at once. A cluster that can *never* offer them
(``local[N]`` with N < S, ``spark.cores.max`` or ``spark.executor.instances`` too small, dynamic allocation
on) is refused at once with a :class:`~sluice.errors.ConfigError` naming the option to change
(:func:`check_cluster`). Otherwise the driver waits (:func:`wait_for_slots`, bounded by
``slot_wait_timeout``) until enough executors registered: at start (executors register after the
application) and at every restart (a lost executor is relaunched by its worker, or the cluster manager
starts another).

**Addresses.** Every sluice listener binds where the address it advertises is served:
:func:`bind_address` gives the loopback address itself when the advertised address is loopback (nothing
else can reach it, so nothing else should), else the wildcard address. The driver advertises
``spark.driver.host`` (what executors already use to reach the driver), a slot the host Spark scheduled its
task on (what its peers' executors already reach). In local mode everything runs on this machine and
stays on loopback.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sluice.errors import ConfigError, SluiceError

__all__ = [
    "DEFAULT_SLOT_WAIT_TIMEOUT",
    "SlotWaitTimeoutError",
    "bind_address",
    "check_cluster",
    "driver_addresses",
    "is_local_master",
    "is_loopback",
    "max_possible_slots",
    "wait_for_slots",
]

log = logging.getLogger("sluice.spark")

#: seconds the driver waits for the cluster to offer a job's task slots (start and every restart)
DEFAULT_SLOT_WAIT_TIMEOUT = 180.0

_LOCAL = re.compile(r"^local(?:\[(?P<n>\*|\d+)(?:\s*,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(?P<n>\d+)\s*,\s*(?P<c>\d+)\s*,\s*\d+\s*\]$")


class SlotWaitTimeoutError(SluiceError):
    """The cluster did not offer the job's task slots within ``slot_wait_timeout``: start executors or
    workers (or free cores other applications hold), or raise ``spark.sluice.slotWaitTimeout``."""


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs executors inside the driver's JVM (``local``, ``local[N]``, ``local[N,F]``)."""
    return master.startswith("local") and not master.startswith("local-cluster")


def _int(conf: Any, key: str, default: int) -> int:
    raw = conf.get(key, None)
    try:
        return int(str(raw).strip()) if raw not in (None, "") else default
    except ValueError:
        raise ConfigError(f"{key} must be an integer (got {raw!r})") from None


def max_possible_slots(conf: Any) -> tuple[int, str] | None:
    """The most task slots the application can ever get, and the setting that caps it; None if unbounded.

    Args:
        conf: the SparkConf (anything with ``get(key, default)``), ``spark.master`` included.
    """
    master = str(conf.get("spark.master", "") or "")
    cpus = max(1, _int(conf, "spark.task.cpus", 1))
    if m := _LOCAL.match(master):
        n = m.group("n")
        cores = (os.cpu_count() or 1) if n == "*" else int(n) if n else 1
        return cores // cpus, f"spark.master={master}: local[N] runs N tasks at once"
    if m := _LOCAL_CLUSTER.match(master):
        return int(m.group("n")) * int(m.group("c")) // cpus, f"spark.master={master}"
    if master.startswith("spark://"):
        if conf.get("spark.cores.max", None) not in (None, ""):
            cores_max = _int(conf, "spark.cores.max", 0)
            return cores_max // cpus, f"spark.cores.max={cores_max}, spark.task.cpus={cpus}"
        return None
    if (master.startswith("yarn") or master.startswith("k8s://")) and conf.get(
        "spark.executor.instances", None
    ) not in (None, ""):
        n, cores = _int(conf, "spark.executor.instances", 0), _int(conf, "spark.executor.cores", 1)
        return (
            n * cores // cpus,
            f"spark.executor.instances={n} x spark.executor.cores={cores} / spark.task.cpus={cpus}",
        )
    return None


def check_cluster(conf: Any, slots: int, job_id: str) -> None:
    """Refuse at once a cluster that can never run the job's barrier stage, saying what to change.

    Args:
        conf: the SparkConf (anything with ``get(key, default)``), ``spark.master`` included.
        slots: task slots the job needs (its largest parallelism).
        job_id: for the message.

    Raises:
        ConfigError: dynamic allocation is on, or the configuration caps the slots below ``slots``.
    """
    if str(conf.get("spark.dynamicAllocation.enabled", "false")).strip().lower() == "true":
        raise ConfigError(
            f"job {job_id!r}: Spark dynamic allocation is on (spark.dynamicAllocation.enabled=true); "
            "sluice runs one long-lived barrier stage whose slots must all run at once, which dynamic "
            "allocation does not support: set spark.dynamicAllocation.enabled=false and give the "
            f"application {slots} task slot(s) (spark.executor.instances x spark.executor.cores / spark.task.cpus)"
        )
    cap = max_possible_slots(conf)
    if cap is not None and cap[0] < slots:
        most, why = cap
        raise ConfigError(
            f"job {job_id!r} needs {slots} Spark task slot(s) (its largest parallelism; every slot hosts one "
            f"subtask of each vertex) but the cluster offers at most {most} ({why}): raise it "
            "(local[N]; spark.cores.max on standalone; spark.executor.instances / spark.executor.cores on "
            f"YARN and Kubernetes), or lower the job's parallelism to {most}"
        )


def wait_for_slots(
    offered: Callable[[], int],
    slots: int,
    timeout: float,
    stop: threading.Event,
    what: str,
    poll: float = 0.5,
) -> bool:
    """Wait until ``offered()`` (task slots the registered executors offer now) reaches ``slots``.

    Logs what it waits for when it starts waiting, every 30 s, and whenever the offer changes.

    Args:
        offered: current task slots of the application.
        slots: task slots needed.
        timeout: seconds to wait at most.
        stop: set when the job is cancelled (returns False at once).
        what: the job and attempt, for the log and the error.
        poll: seconds between looks.

    Returns:
        True when the slots are there, False if ``stop`` was set first.

    Raises:
        SlotWaitTimeoutError: not enough slots within ``timeout``.
    """
    have = offered()
    if have >= slots:
        return True
    start = time.monotonic()
    last_log, last_have = start, have
    log.warning(
        "%s: waiting up to %.0fs (slot_wait_timeout) for %d Spark task slot(s); the cluster offers %d now",
        what, timeout, slots, have,
    )  # fmt: skip
    while have < slots:
        now = time.monotonic()
        if now - start >= timeout:
            raise SlotWaitTimeoutError(
                f"{what}: the cluster offered {have} of the {slots} Spark task slot(s) the job needs for "
                f"{timeout:.0f}s (slot_wait_timeout): start more executors or workers (or free cores other "
                "applications hold), or raise spark.sluice.slotWaitTimeout / SLUICE_SLOT_WAIT_TIMEOUT"
            )
        if stop.wait(poll):
            return False
        have = offered()
        if have < slots and (have != last_have or time.monotonic() - last_log >= 30):
            log.warning("%s: the cluster offers %d of %d task slot(s), waiting", what, have, slots)
            last_log, last_have = time.monotonic(), have
    log.warning("%s: %d task slot(s) available after %.1fs", what, have, time.monotonic() - start)
    return True


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP literal or a name) is a loopback address (every address it resolves to)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%", 1)[0]).is_loopback for i in infos)


def bind_address(advertised: str) -> str:
    """Where to listen so that ``advertised`` reaches the listener: the loopback address itself (an IP, the
    name resolved) when it is loopback, else every interface (``0.0.0.0``, ``::`` for an IPv6 address)."""
    if is_loopback(advertised):
        try:
            return str(ipaddress.ip_address(advertised))
        except ValueError:
            infos = socket.getaddrinfo(advertised, None, proto=socket.IPPROTO_TCP)
            v4 = [i for i in infos if i[0] == socket.AF_INET]  # "localhost": 127.0.0.1 before ::1
            return str((v4 or infos)[0][4][0])
    try:
        return "::" if ipaddress.ip_address(advertised).version == 6 else "0.0.0.0"
    except ValueError:
        return "0.0.0.0"


def driver_addresses(conf: Any, override: str | None) -> tuple[str, str]:
    """(bind, advertise) of the driver's control server.

    Local mode: loopback (executors run in the driver's JVM). A cluster: ``override``
    (``SLUICE_DRIVER_HOST`` / ``spark.sluice.driver.host``) else ``spark.driver.host``, the address
    executors already reach the driver at; bound as :func:`bind_address` says.
    """
    if is_local_master(str(conf.get("spark.master", "") or "")):
        return "127.0.0.1", "127.0.0.1"
    host = override or conf.get("spark.driver.host", None) or socket.gethostname()
    return bind_address(host), host
