"""The ``sluice`` command line: one module per verb, registered on the :func:`main` group.

* ``sluice run`` (:mod:`sluice.cli.run`), ``sluice checkpoints`` (:mod:`sluice.cli.checkpoints`),
  ``sluice new`` (:mod:`sluice.cli.new`, templates rendered by :mod:`sluice.cli.scaffold`),
  ``sluice package`` (:mod:`sluice.cli.package`: the job's virtualenv for Spark executors);
* commands of other packages through the ``sluice.commands`` entry point group (``sluice demo``).
"""

from sluice.cli import checkpoints, new, package, run  # noqa: F401 - importing a verb's module registers it
from sluice.cli.main import main

__all__ = ["main"]
