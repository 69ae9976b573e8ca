"""The ``sluice`` command line: one module per verb, registered on the :func:`main` group.

* ``sluice run`` (:mod:`sluice.cli.run`), ``sluice checkpoints`` (:mod:`sluice.cli.checkpoints`),
  ``sluice new`` (:mod:`sluice.cli.new`, templates rendered by :mod:`sluice.cli.scaffold`),
  ``sluice package`` (:mod:`sluice.cli.package`: the job's virtualenv for Spark executors);
* running jobs, through their control endpoint (:mod:`sluice.cli.endpoint`): ``sluice jobs``, ``status``,
  ``savepoint``, ``stop``, ``cancel``, ``dashboard``;
* commands of other packages through the ``sluice.commands`` entry point group (``sluice demo``).
"""

from sluice.cli import (  # noqa: F401 - importing a verb's module registers it
    cancel,
    checkpoints,
    dashboard,
    jobs,
    new,
    package,
    run,
    savepoint,
    status,
    stop,
)
from sluice.cli.main import main

__all__ = ["main"]
