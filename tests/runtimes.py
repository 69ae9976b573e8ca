"""The runtimes a job test runs on: the ``runtime`` fixture (tests/conftest.py) gives each in turn.

Job tests that must hold on both runtimes take ``runtime``; those that take tens of seconds on Spark use
``@spark_in_soak`` so that their Spark half runs only with ``-m soak``.
"""

from __future__ import annotations

import pytest

#: both runtimes, the Spark one marked ``spark``
BOTH = ["local", pytest.param("spark", marks=pytest.mark.spark)]

#: both runtimes through the ``runtime`` fixture, the Spark half also marked ``soak`` (not in the default run)
spark_in_soak = pytest.mark.parametrize(
    "runtime", ["local", pytest.param("spark", marks=[pytest.mark.spark, pytest.mark.soak])], indirect=True
)
