"""benchmarks/_common.py: how every benchmark alternates rounds, takes ratios and replays changes (its judges)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

# loaded by path, not through sys.path: the benchmark scripts' module names must not shadow anything here
_spec = importlib.util.spec_from_file_location("bench_common", Path(__file__).resolve().parent.parent / "benchmarks" / "_common.py")
assert _spec is not None and _spec.loader is not None
common = importlib.util.module_from_spec(_spec)
sys.modules["bench_common"] = common  # its dataclasses look their module up
_spec.loader.exec_module(common)
Timing, alternate, ratios, replay_changes, same_table = (
    common.Timing, common.alternate, common.ratios, common.replay_changes, common.same_table
)  # fmt: skip


def test_rounds_rotate_the_order_after_a_warm_up_of_each_side() -> None:
    order: list[tuple[str, int]] = []
    got = alternate(["a", "b", "c"], 3, lambda side, r: order.append((side, r)) or r)
    assert order == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1), ("b", 2), ("c", 2), ("a", 2),
                     ("c", 3), ("a", 3), ("b", 3)]  # fmt: skip
    assert got == {"a": [1, 2, 3], "b": [1, 2, 3], "c": [1, 2, 3]}  # the warm-up is not returned


def test_a_ratio_is_the_median_of_the_rounds_by_the_named_metric() -> None:
    a = [Timing(1.0, 4.0), Timing(2.0, 4.0), Timing(10.0, 4.0)]
    b = [Timing(2.0, 2.0), Timing(2.0, 2.0), Timing(2.0, 2.0)]
    out: dict[str, Any] = {}
    ratios(out, "a_vs_b", a, b, "wall", ">= 0.9")  # rates: work / time
    assert out["a_vs_b"] == 1.0 and out["a_vs_b_runs"] == [2.0, 1.0, 0.2] and out["a_vs_b_spread"] == [0.2, 2.0]
    assert out["a_vs_b_cpu"] == 0.5  # the other metric beside, judged by nothing
    ratios(out, "t", a, b, "cpu", of="time")
    assert out["t"] == 2.0 and out["t_wall"] == 1.0


def test_the_replay_applies_each_keys_last_change() -> None:
    base = pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]})
    changes = pa.table({"id": [2, 3, 4, 2, 5, 5], "v": ["x", "y", "z", "w", "p", "q"],
                        "_sluice_op": pa.array([1, 2, 0, 1, 0, 2], pa.int8()), "_sluice_order": [1, 2, 3, 4, 5, 6]})  # fmt: skip
    got = replay_changes(base, [changes, changes.slice(0, 1)])  # then id 2 set to "x" again
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "v": "a"}, {"id": 2, "v": "x"}, {"id": 4, "v": "z"}
    ]  # fmt: skip
    assert same_table(got, pa.table({"id": [4, 2, 1], "v": ["z", "x", "a"]})) is None
    assert same_table(got, pa.table({"id": [4, 2, 1], "v": ["z", "w", "a"]})) == "columns ['v'] differ"
    with pytest.raises(AssertionError):
        assert same_table(got, base) is None
