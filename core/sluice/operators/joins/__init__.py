"""Joins of two keyed streams (``Stream.join_latest``, ``Stream.interval_join``).

Both are two-input operators: the left stream feeds input 0, the right stream input 1, each through a hash
exchange on its own key columns (equal key values meet in the same subtask), and the operator's watermark
is the minimum of both inputs'.

* :mod:`~sluice.operators.joins.latest` - enrichment: each left record joined with the latest row of its key
  in the right stream (a table: upserts, tombstones delete), held in keyed state;
* :mod:`~sluice.operators.joins.interval` - an interval join: ``left.t`` between ``right.t - lower`` and
  ``right.t + upper``, both sides buffered until the watermark passes their bound.
"""

from sluice.operators.joins.interval import IntervalJoinOperator
from sluice.operators.joins.latest import LatestJoinOperator

__all__ = ["IntervalJoinOperator", "LatestJoinOperator"]
