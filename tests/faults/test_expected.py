"""The fault suites' reference (tests/faults/expected.py) is computed from the input, never by running a job."""

from __future__ import annotations

import pytest
from sluice import Pipeline

from tests.faults.expected import expected_rows
from tests.faults.shapes import SHAPES, Input
from tests.faults.test_exactly_once import SHAPE_ID, reference


def test_the_reference_runs_no_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the reference was a failure-free sluice run: a bug that lost or changed rows in every run
    (failure-free or not) passed every scenario. Now no job runs to make it."""

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the reference ran a job")

    monkeypatch.setattr(Pipeline, "run", refuse)
    monkeypatch.setattr(Pipeline, "start", refuse)
    for shape in SHAPES:
        assert reference.__wrapped__(shape.name, 3), shape.name


def test_expected_rows_by_hand() -> None:
    """Two splits of ten rows: ``k`` = split * 100 + seq % 8, so seq 8 and 9 continue the keys of seq 0 and 1."""
    gen = [Input("generator", 2, 10, 0)]
    keyed = expected_rows("keyed", gen)  # rows: (count, id, k, sum)
    assert len(keyed) == 20
    assert (1, 0, 0, 0) in keyed and (2, 8, 0, 56) in keyed  # id 8: value 56, the second row of key 0
    assert (2, 19, 101, 7 * 11 + 7 * 19 % 1000) in keyed  # split 1: ids 10..19, key 101 holds ids 11, 19
    two = expected_rows("two_keyed", gen)  # the second count sums the first counts: 1, then 1 + 2
    assert (1, 0, 0, 1) in two and (2, 8, 0, 3) in two
    chain = expected_rows("chain", gen)  # (double, id, key, seq, split, ts, value)
    assert chain[13] == (182, 13, 13, 3, 1, 1_600_000_000_030, 91)
    assert expected_rows("rebalance", gen) == tuple((i, i * 7 % 1000) for i in range(20))
    union = expected_rows("union", [Input("gen-a", 1, 2, 0), Input("gen-b", 1, 2, 10**9)])
    assert union == ((1, 0, 0, 0), (1, 1, 1, 7), (1, 10**9, 10**6, 0), (1, 10**9 + 1, 10**6 + 1, 7))


@pytest.mark.parametrize("shape", [s.name for s in SHAPES])
def test_the_id_column_of_each_shape_holds_the_input_ids(shape: str) -> None:
    """The at-least-once family checks every input id reached the sink by this column (it named the key
    column for four shapes before: 50 keys stood for hundreds of ids)."""
    ids = sorted(row[SHAPE_ID[shape]] for row in reference(shape, 3))
    assert len(ids) == len(set(ids)) and len(ids) >= 200, shape
