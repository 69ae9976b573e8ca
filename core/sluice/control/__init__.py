"""Operating a running job: the driver's HTTP control endpoint, its metrics, the dashboard, and the
registry the CLI finds running jobs through (ARCHITECTURE.md 7b; see docs/operations.md).

* :mod:`sluice.control.monitor` - what the driver knows of a job across attempts (metrics, checkpoints,
  failures, rates);
* :mod:`sluice.control.metrics` - the Prometheus metrics (prometheus_client) and their names;
* :mod:`sluice.control.server` - the endpoint (aiohttp, in a daemon thread of the driver) and the
  dashboard it serves;
* :mod:`sluice.control.registry` - the running-jobs registry next to checkpoint storage, and token files;
* :mod:`sluice.control.client` - the CLI's client of the endpoint;
* :mod:`sluice.control.progress` - the live progress of ``sluice run``.
"""

__all__: list[str] = []
