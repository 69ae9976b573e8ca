"""The JVM of an embedded SparkContext: its log configuration, its start-up banner, its executors' Python.

* **Quiet by default.** A SparkContext that sluice creates (``sluice run``, ``pipeline.run()``, the demo)
  starts its JVM through a pipe (:func:`launch_gateway`) that drops the lines every start prints
  (``WARNING: Using incubator modules``, ``Setting default log level``, ...) and passes everything else on
  to stderr. With ``sluice -v`` (the ``sluice.spark`` logger at INFO) nothing is dropped.
* **Local masters and shipped environments.** ``spark-submit --master 'local[2]' --archives
  env.tar.gz#environment`` with ``PYSPARK_PYTHON=./environment/bin/python`` (the line ``sluice package``
  prints) fails on a cluster-less run: local executors start Python in the driver's working directory,
  while Spark unpacks the archive under its files root. :func:`local_python` points the executors at the
  unpacked archive there.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import IO, Any

__all__ = ["BANNER", "LOG4J2", "launch_gateway", "local_python"]

log = logging.getLogger("sluice.spark")

# slot failures are reported by sluice (run_job's failures, the driver log): Spark's copies are noise
LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = fatal
logger.tsm.name = org.apache.spark.scheduler.TaskSetManager
logger.tsm.level = fatal
logger.pyrunner.name = org.apache.spark.api.python.PythonRunner
logger.pyrunner.level = fatal
"""

#: what the JVM and Spark print at every start, whatever the log configuration
BANNER = re.compile(
    rb"^(WARNING: Using incubator modules: .*"
    rb"|Setting default log level to .*"
    rb"|To adjust logging level use sc\.setLogLevel.*"
    rb"|Using Spark's default log4j profile: .*)\r?\n?$"
)


def _relay(stream: IO[bytes], fd: int) -> None:
    """Copy ``stream`` to file descriptor ``fd`` line by line, without the banner; never stops reading
    before the end (the JVM would block on a full pipe)."""
    for line in iter(stream.readline, b""):
        if BANNER.match(line):
            continue
        try:
            os.write(fd, line)
        except OSError:
            pass
    stream.close()


def launch_gateway(conf: Any) -> Any:
    """Start the JVM for a new SparkContext (``SparkContext(conf=conf, gateway=...)``); its stderr goes
    through a thread that drops the start-up banner unless ``sluice.spark`` logs at INFO or below."""
    from pyspark.java_gateway import launch_gateway as pyspark_launch

    if log.isEnabledFor(logging.INFO):
        return pyspark_launch(conf)  # type: ignore[no-untyped-call]
    read, write = os.pipe()
    try:
        gateway = pyspark_launch(conf, popen_kwargs={"stderr": write})  # type: ignore[no-untyped-call]
    finally:
        os.close(write)  # the JVM holds its copy
    stream = os.fdopen(read, "rb")
    threading.Thread(target=_relay, args=(stream, 2), name="sluice-jvm-stderr", daemon=True).start()
    return gateway


def local_python(sc: Any) -> None:
    """In local mode, a relative ``PYSPARK_PYTHON`` (``./environment/bin/python``) that is not there in
    the driver's working directory is resolved where Spark unpacked the job's archives, as on a cluster's
    executors. Leaves anything else as it is."""
    exec_ = str(getattr(sc, "pythonExec", "") or "")
    if os.path.isabs(exec_) or "/" not in exec_ or os.path.exists(exec_):
        return
    from pyspark import SparkFiles

    unpacked = os.path.join(SparkFiles.getRootDirectory(), exec_)
    if os.path.exists(unpacked):
        log.info("local master: executors run %s (the archive Spark unpacked), not %s", unpacked, exec_)
        sc.pythonExec = unpacked
