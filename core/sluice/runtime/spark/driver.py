"""The Spark runtime (``runtime="spark"``, the default): one barrier-mode stage of S slots per attempt.

The driver keeps the control plane (:class:`~sluice.runtime.attempt.JobAttempt`: coordinator, enumerators)
and a :class:`~sluice.runtime.spark.control.ControlServer`; it submits ``rdd.barrier().mapPartitions`` with
S = the job's largest parallelism, and every Spark task runs a slot (:mod:`sluice.runtime.spark.slot`). When
all slots registered their subtasks the driver starts the control plane and tells them to start. A failed
slot fails the attempt (it reports why, its control connection breaks, or the stage fails); the driver
tells the slots to cancel, waits for their last reports (so the attempt's root cause is final), cancels
the stage's job group, and ``run_job`` restarts from the latest completed checkpoint, which every slot
loads from storage.

Which Spark: an active SparkContext, else the one ``spark-submit`` prepared, else ``master`` (or
``SLUICE_SPARK_MASTER``), else an embedded ``local[S,1]``. The context is created once per process and
reused by every attempt and job. See docs/spark.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import sluice.runtime.spark.messages as messages
from sluice.config.job import JobConfig
from sluice.errors import ConfigError, SluiceError
from sluice.graph import ExecutionGraph
from sluice.runtime.attempt import AttemptCancelled, FailureKind, JobAttempt
from sluice.runtime.fault_hook import FaultHook
from sluice.runtime.spark.cluster import (
    DEFAULT_SLOT_WAIT_TIMEOUT,
    check_cluster,
    driver_addresses,
    is_local_master,
    wait_for_slots,
)
from sluice.runtime.spark.control import ControlServer
from sluice.runtime.spark.jvm import LOG4J2, launch_gateway, local_python
from sluice.runtime.spark.rpc import TlsConfig
from sluice.runtime.spark.slot import slot_function
from sluice.runtime.spark.slot_spec import SlotSpec

__all__ = ["SparkOptions", "SparkRuntime", "SparkStageError", "spark_context"]

log = logging.getLogger("sluice.spark")

#: settings of an embedded (local-mode) SparkContext: quiet, loopback only, no Spark task retries
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.python.task.killTimeout": "200ms",
    "spark.python.worker.reuse": "false",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "1",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "1s",
}


class SparkStageError(SluiceError):
    """The attempt's barrier stage failed (a slot raised or its Python worker died)."""


@dataclass(frozen=True)
class SparkOptions:
    """Options of the Spark runtime. Unset fields come from the environment or the Spark configuration.

    Attributes:
        tls: TLS for slot <-> driver and slot <-> slot connections (``SLUICE_TLS_CERT``/``_KEY``/``_CA``,
            or ``spark.sluice.tls.certFile``/``keyFile``/``caFile``: PEM files on the driver).
        driver_host: address slots use to reach the driver's control server (``SLUICE_DRIVER_HOST`` or
            ``spark.sluice.driver.host``; default ``spark.driver.host``).
        slot_wait_timeout: seconds to wait, at start and at every restart, until the cluster offers the
            job's task slots (executors register after the application starts; a lost executor is
            relaunched): ``SLUICE_SLOT_WAIT_TIMEOUT`` or ``spark.sluice.slotWaitTimeout``, default 180 s.
        startup_timeout: seconds to wait for all slots to register (Spark scheduling included).
        stop_timeout: seconds to wait for the stage to end after stop or cancel.
        cancel_grace: seconds a failed attempt's slots get to stop and report (so the driver learns the
            root cause from them) before the driver cancels the Spark stage.
    """

    tls: TlsConfig | None = None
    driver_host: str | None = None
    slot_wait_timeout: float | None = None
    startup_timeout: float = 300.0
    stop_timeout: float = 30.0
    cancel_grace: float = 10.0

    def resolved(self, conf: Any) -> SparkOptions:
        """Fill unset options from the environment, then from the Spark configuration ``conf``."""

        def opt(env: str, key: str) -> str | None:
            return os.environ.get(env) or conf.get(key, None) or None

        tls = self.tls
        cert, key = (
            opt("SLUICE_TLS_CERT", "spark.sluice.tls.certFile"),
            opt("SLUICE_TLS_KEY", "spark.sluice.tls.keyFile"),
        )
        if tls is None and (cert or key):
            if not (cert and key):
                raise ConfigError(
                    "TLS needs both a certificate and a key: set SLUICE_TLS_CERT and SLUICE_TLS_KEY"
                )
            tls = TlsConfig.from_files(cert, key, opt("SLUICE_TLS_CA", "spark.sluice.tls.caFile"))
        host = self.driver_host or opt("SLUICE_DRIVER_HOST", "spark.sluice.driver.host")
        wait = self.slot_wait_timeout
        if wait is None:
            raw = opt("SLUICE_SLOT_WAIT_TIMEOUT", "spark.sluice.slotWaitTimeout")
            try:
                wait = float(raw) if raw is not None else DEFAULT_SLOT_WAIT_TIMEOUT
            except ValueError:
                wait = -1.0
        if not wait >= 0:
            raise ConfigError(
                "slot_wait_timeout (SLUICE_SLOT_WAIT_TIMEOUT, spark.sluice.slotWaitTimeout) must be a number "
                f"of seconds >= 0 (got {self.slot_wait_timeout if self.slot_wait_timeout is not None else raw!r})"
            )
        return dataclasses.replace(self, tls=tls, driver_host=host, slot_wait_timeout=wait)


def spark_context(slots: int, master: str | None = None) -> Any:
    """The process's SparkContext: the active one, spark-submit's, or a new one (embedded ``local[slots,1]``
    when no master is configured). Created once, reused by every attempt and job."""
    from pyspark import SparkConf, SparkContext

    active = SparkContext._active_spark_context
    if active is not None:
        if master is not None and active.master != master:
            log.warning("a SparkContext on %s is active: using it, not master=%s", active.master, master)
        return active
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # started by spark-submit / pyspark: its master and conf
        submitted = SparkConf()
        if not submitted.contains("spark.task.maxFailures"):
            # a failed slot fails the attempt and sluice's restart strategy restarts the job from its latest
            # checkpoint; Spark retrying the barrier stage by itself first only delays that
            submitted.set("spark.task.maxFailures", "1")
        sc = SparkContext.getOrCreate(submitted)
        if is_local_master(str(sc.master)):
            local_python(sc)  # PYSPARK_PYTHON=./environment/bin/python with --archives, in local mode
        return sc
    master = master or os.environ.get("SLUICE_SPARK_MASTER") or f"local[{slots},1]"
    conf = SparkConf().setMaster(master).setAppName("sluice")
    if is_local_master(master):
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        for k, v in LOCAL_CONF.items():
            conf.set(k, v)
        fd, path = tempfile.mkstemp(prefix="sluice-log4j2-", suffix=".properties")
        with os.fdopen(fd, "w") as f:
            f.write(LOG4J2)
        conf.set("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile=file:{path}")
    else:
        conf.set("spark.task.maxFailures", "1")
    # a new JVM's start-up banner is dropped (kept with `sluice -v`); a stopped context's JVM is reused
    gateway = launch_gateway(conf) if SparkContext._gateway is None else None
    sc = SparkContext(conf=conf, gateway=gateway)
    sc.setLogLevel("ERROR")
    return sc


def _max_concurrent_tasks(sc: Any) -> int:
    jsc = sc._jsc.sc()
    return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))


def _absolute_storage(cfg: JobConfig) -> JobConfig:
    """Slots may run in another working directory: make a relative local checkpoint path absolute."""
    storage = cfg.checkpoint.storage
    if "://" in storage and not storage.startswith("file://"):
        return cfg
    path = storage[len("file://") :] if storage.startswith("file://") else storage
    if os.path.isabs(path):
        return cfg
    chk = cfg.checkpoint.model_copy(update={"storage": os.path.abspath(path)})
    return dataclasses.replace(cfg, checkpoint=chk)


class SparkRuntime:
    """Runs attempts of a job as Spark barrier stages. ``cancel()`` stops the current attempt for good.

    Args:
        master: Spark master URL; None = the active or spark-submit's context, else embedded local mode.
        options: TLS, driver address and timeouts (unset fields from the environment / Spark conf).
    """

    def __init__(self, master: str | None = None, options: SparkOptions | None = None) -> None:
        self.master = master
        self.options = options or SparkOptions()
        self.cancelled = threading.Event()
        self.current: JobAttempt | None = None
        self._secret = secrets.token_bytes(32)  # per job: every attempt's connections prove it
        self._sc: Any = None
        self._group: str | None = None
        self._server: ControlServer | None = None

    def cancel(self) -> None:
        self.cancelled.set()
        if self.current is not None:
            self.current.done.set()
        if self._server is not None:
            self._server.killing()  # the slots it kills are not failures
        if self._sc is not None and self._group is not None:
            self._sc.cancelJobGroup(self._group)

    def run_attempt(self, a: JobAttempt, faults: FaultHook) -> None:
        self.current = a
        if self.cancelled.is_set():
            a.failure = AttemptCancelled("cancelled")
            return
        slots = a.job.num_slots
        sc = self._sc = spark_context(slots, self.master)
        conf = sc.getConf()
        check_cluster(conf, slots, a.cfg.job_id)
        opts = self.options.resolved(conf)
        assert opts.slot_wait_timeout is not None
        what = f"job {a.cfg.job_id!r} attempt {a.attempt}"
        if not wait_for_slots(
            lambda: _max_concurrent_tasks(sc), slots, opts.slot_wait_timeout, self.cancelled, what
        ):
            a.failure = AttemptCancelled("cancelled")
            return
        bind, driver_host = driver_addresses(conf, opts.driver_host)
        server = ControlServer(a, slots, self._secret, opts.tls, bind, faults)
        self._server = server
        for sid in ExecutionGraph(a.job).subtasks():
            a.register(sid, server.handle(sid))
        r = a.restored
        spec = SlotSpec(
            job=a.job,
            cfg=_absolute_storage(a.cfg),
            attempt=a.attempt,
            slots=slots,
            driver=(driver_host, server.port),
            secret=self._secret,
            tls=opts.tls,
            host="127.0.0.1" if is_local_master(sc.master) else None,
            restore_path=r.path if r is not None else None,
            drop_channel_state=bool(r is not None and r.drop_channel_state),
            faults=faults.for_attempt(a.attempt),
        )
        log.info(
            "job %r attempt %d: %d slot(s) on %s, driver at %s:%d (bound to %s), TLS %s",
            a.cfg.job_id,
            a.attempt,
            slots,
            sc.master,
            driver_host,
            server.port,
            bind,
            "on" if opts.tls is not None else "off",
        )
        group = self._group = f"sluice-{a.cfg.job_id}-{a.attempt}-{secrets.token_hex(4)}"
        stage = threading.Thread(
            target=self._run_stage, args=(sc, spec, group, a, server), name="sluice-stage", daemon=True
        )
        stage.start()
        try:
            self._drive(a, server, opts)
        finally:
            self._end_stage(a, server, stage, sc, group, opts)

    def _end_stage(
        self,
        a: JobAttempt,
        server: ControlServer,
        stage: threading.Thread,
        sc: Any,
        group: str,
        opts: SparkOptions,
    ) -> None:
        ok = a.failure is None and len(a.finished_tasks) == len(a.tasks)
        server.end(messages.Stop() if ok else messages.Cancel())
        # a slot's reports precede the end of its connection: once every connection ended, every failure
        # the slots reported is in and the attempt's root cause is final. Only then kill what is left.
        server.wait_closed(opts.stop_timeout if ok else opts.cancel_grace)
        if not ok:
            server.killing()
            sc.cancelJobGroup(group)
        stage.join(opts.stop_timeout)
        if stage.is_alive():
            server.killing()
            sc.cancelJobGroup(group)
            log.warning("attempt %d: the Spark stage did not end within %.0fs", a.attempt, opts.stop_timeout)
        server.close()

    def _drive(self, a: JobAttempt, server: ControlServer, opts: SparkOptions) -> None:
        deadline = time.monotonic() + opts.startup_timeout
        while not server.all_registered.wait(0.05):
            if a.done.is_set():
                break
            if time.monotonic() > deadline:
                a.failed(None, SparkStageError(f"slots did not register within {opts.startup_timeout:.0f}s"))
                break
        if not a.done.is_set():
            levels = {"": logging.getLogger().getEffectiveLevel()}
            levels["sluice"] = logging.getLogger("sluice").getEffectiveLevel()
            a.start_control()
            server.broadcast(messages.Start(levels))
        a.done.wait()
        if self.cancelled.is_set() and a.failure is None:
            a.failure = AttemptCancelled("cancelled")

    def _run_stage(self, sc: Any, spec: SlotSpec, group: str, a: JobAttempt, server: ControlServer) -> None:
        job_id = spec.cfg.job_id
        sc.setJobGroup(
            group,
            f"sluice job '{job_id}' attempt {spec.attempt} ({spec.slots} slots)",
            interruptOnCancel=True,
        )
        try:
            rdd = sc.parallelize(range(spec.slots), spec.slots)
            rdd.barrier().mapPartitions(slot_function(spec)).collect()
        except Exception as exc:
            if not server.ending:  # a slot failed (it reported why, or its connection tells) or Spark did
                a.failed(None, _stage_error(exc, spec.attempt), FailureKind.CONSEQUENCE)
        else:
            if not server.ending and not a.done.is_set():
                a.failed(None, SparkStageError(f"the slots of attempt {spec.attempt} ended early"))


#: an exception line of a Java stack trace or a Python traceback: ``pkg.Type[: message]``
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.$]*(?:Exception|Error|Exit|Interrupt))(?::\s*(?P<msg>.*))?$")


def _wrapper(kind: str, message: str) -> bool:
    """Whether an exception line only wraps the executor's: py4j's call failure, Spark's job abort, a
    Python worker's traceback (its last line is the exception)."""
    name = kind.rsplit(".", 1)[-1]
    return (
        name == "Py4JJavaError"
        or (name == "SparkException" and message.startswith("Job aborted"))
        or (name == "PythonException" and message.startswith("Traceback"))
    )


def executor_cause(text: str) -> str | None:
    """The executor-side cause in the text of a failed Spark job (``str`` of py4j's error: the driver's
    stack trace with the failed task's exception in it), as ``Type: message``; None if there is none.

    A Python exception (the last line of a traceback a Python worker sent) is preferred over the Java
    exceptions around it; wrappers (the job abort, a ``PythonException`` holding a traceback) are skipped,
    and so are ``Caused by:`` lines (the exception they explain comes first).
    """
    python: list[str] = []
    java: list[str] = []
    for raw in text.splitlines():
        line = raw.strip().removeprefix(": ")
        m = _EXCEPTION_LINE.match(line)
        if m is None or _wrapper(m["type"], m["msg"] or ""):
            continue
        if m["type"].startswith(("java.", "javax.", "org.", "py4j.", "scala.")):
            java.append(line)
        else:
            python.append(line)
    found = python or java
    return found[0] if found else None


def _stage_error(exc: BaseException, attempt: int) -> SparkStageError:
    """The error a failed barrier stage ends its attempt with: the executor's exception, not Spark's
    "barrier task finished unsuccessfully"."""
    text = str(exc)
    cause = executor_cause(text)
    if cause is None:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        cause = (lines[1] if len(lines) > 1 else lines[0] if lines else type(exc).__name__)
    cause = " ".join(cause.split())[:500]
    if "Cannot run program" in cause:  # the executors' Python does not exist: no restart cures that
        return SparkStageError(
            f"the executors cannot start Python ({cause}): PYSPARK_PYTHON (spark.pyspark.python) must name a "
            "Python that every executor has, e.g. ./environment/bin/python with --archives ENV.tar.gz#environment "
            "(sluice package prints that line)",
            recoverable=False,
        )
    if cause.startswith("ModuleNotFoundError"):  # the executors' Python lacks a module the job needs
        return SparkStageError(
            f"the executors' Python cannot import what the job needs ({cause}): install it there, or ship "
            "the job's virtualenv (sluice package prints the spark-submit line)",
            recoverable=False,
        )
    return SparkStageError(f"the Spark stage of attempt {attempt} failed on an executor: {cause}")
