"""One SparkContext for the whole session (startup takes 5-20 s): local[4,1], reused by every test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

SLOTS = 4


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from sluice.runtime.spark import spark_context

    sc = spark_context(SLOTS)
    yield sc
    sc.stop()
