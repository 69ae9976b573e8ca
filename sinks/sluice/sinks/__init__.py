"""Two-phase-commit sinks for sluice, and the sink SPI (re-exported from ``sluice.sink``).

* ``sluice.sinks.files`` - Parquet / JSON lines / CSV files on local disk or S3, with compaction;
* ``sluice.sinks.testing`` - a small two-phase-commit sink the fault-injection suite reads back.
"""

from sluice.sink import Committer, GlobalCommitter, Sink, SinkContext, SinkWriter

__all__ = ["Committer", "GlobalCommitter", "Sink", "SinkContext", "SinkWriter"]
