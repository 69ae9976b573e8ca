"""The public API to declare a job: ``Pipeline`` with sources, streams and sinks.

Example::

    p = Pipeline("orders", checkpoint=CheckpointConfig(interval=1.0, storage="/tmp/chk"))
    orders = p.source(GeneratorSource(...))
    totals = orders.filter(pc.field("amount") > 0).key_by("customer").process(RunningTotal())
    totals.sink(FileSink("/data/totals", format="parquet"))
    p.run(runtime="local")

:mod:`sluice.api.pipeline` holds :class:`Pipeline` (sources, building, starting and running a job),
:mod:`sluice.api.stream` the streams (:class:`Stream`, :class:`KeyedStream`).
"""

from sluice.api.pipeline import DEFAULT_CONTROL_ENDPOINT as DEFAULT_CONTROL_ENDPOINT
from sluice.api.pipeline import RUNTIMES as RUNTIMES
from sluice.api.pipeline import Pipeline
from sluice.api.stream import KeyedStream, Stream
from sluice.client import JobClient
from sluice.config.job import JobConfig as JobConfig
from sluice.runtime.job import JobResult as JobResult

__all__ = ["JobClient", "KeyedStream", "Pipeline", "Stream"]
