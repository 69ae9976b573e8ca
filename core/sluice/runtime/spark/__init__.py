"""The Spark runtime (``runtime="spark"``): the only part of sluice that imports pyspark.

* :mod:`~sluice.runtime.spark.driver`: :class:`SparkRuntime` submits one barrier stage per attempt and
  drives it; :func:`spark_context` chooses the cluster.
* :mod:`~sluice.runtime.spark.cluster`: :func:`check_cluster` refuses clusters that can never offer the
  job's task slots, the driver waits for the others (``slot_wait_timeout``); bind and advertise addresses.
* :mod:`~sluice.runtime.spark.control`: the driver's control server, which slots report to.
* :mod:`~sluice.runtime.spark.slot`: what runs in each Spark task (a slot hosting one subtask per vertex).
* :mod:`~sluice.runtime.spark.messages`: the control protocol between driver and slots.
* :mod:`~sluice.runtime.spark.transport`: the slot-to-slot data plane (Arrow IPC frames with credits).
* :mod:`~sluice.runtime.spark.rpc`: authenticated (HMAC, optional TLS) framed connections.

See docs/spark.md.
"""

from sluice.runtime.spark.cluster import SlotWaitTimeoutError, check_cluster
from sluice.runtime.spark.driver import SparkOptions, SparkRuntime, SparkStageError, spark_context

__all__ = [
    "SlotWaitTimeoutError",
    "SparkOptions",
    "SparkRuntime",
    "SparkStageError",
    "check_cluster",
    "spark_context",
]
