"""benchmarks/_checks.py: the judges the benchmarks check their outputs with must agree with the inputs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str) -> ModuleType:
    """A benchmark module loaded by path, not through sys.path (the scripts' names must shadow nothing)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"bench_{name}"] = mod
    spec.loader.exec_module(mod)
    return mod


checks = _load("_checks")


def test_the_generator_reference_is_what_the_source_emits() -> None:
    from sluice.connectors.generator import GeneratorSource

    src = GeneratorSource(num_splits=3, records_per_split=50, num_keys=7, step_ms=5)
    emitted = pa.Table.from_batches([src.make_rows(s, 0, 50) for s in range(3)])
    ref = checks.generator_rows(3, 50, 7, step_ms=5)
    for col in ref.column_names:
        assert emitted.column(col).to_pylist() == ref.column(col).to_pylist(), col
    assert checks.check_generator_output(emitted, 3, 7, 50, step_ms=5) == {"rows": 150, "splits": 3}


def test_an_unbounded_generators_output_must_be_each_splits_first_rows() -> None:
    from sluice.connectors.generator import GeneratorSource

    src = GeneratorSource(num_splits=2, records_per_split=None, num_keys=9)
    prefix = pa.Table.from_batches([src.make_rows(0, 0, 30), src.make_rows(1, 0, 12)])
    assert checks.check_generator_output(prefix, 2, 9) == {"rows": 42, "splits": 2}
    gap = pa.Table.from_batches([src.make_rows(0, 0, 10), src.make_rows(0, 11, 30)])
    with pytest.raises(RuntimeError, match="split 0 has 29 rows but reaches row 29"):
        checks.check_generator_output(gap, 2, 9)
    with pytest.raises(RuntimeError, match="1 rows written more than once"):
        checks.check_generator_output(pa.concat_tables([prefix, prefix.slice(3, 1)]), 2, 9)


def test_a_wrong_column_or_a_missing_row_is_found() -> None:
    rows = checks.generator_rows(2, 20, 5)
    wrong = rows.set_column(rows.schema.get_field_index("value"), "value", pa.array([1] * 40, pa.int64()))
    with pytest.raises(RuntimeError, match="column 'value' differs"):
        checks.check_generator_output(wrong, 2, 5, 20)
    with pytest.raises(RuntimeError, match="39 rows, the input has 40"):
        checks.check_generator_output(rows.slice(1), 2, 5, 20)


def test_the_kafka_ceiling_rows_are_its_messages_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # kafka_ceiling imports its neighbour cpu.py
    ceiling = _load("kafka_ceiling")
    sys.modules.pop("cpu", None)  # nothing else sees that name
    ref = checks.ceiling_rows(123_457).slice(123_450).to_pylist()
    assert [json.loads(ceiling.value(i)) for i in range(123_450, 123_457)] == ref


class _Ctx:
    subtask, attempt = 1, 0


def test_the_id_sink_publishes_only_committed_checkpoints(tmp_path: Path) -> None:
    sink = checks.IdSink(str(tmp_path / "out"))
    writer, committer = sink.create_writer(_Ctx(), []), sink.create_committer(_Ctx())
    batch = checks.generator_rows(1, 10, 3).to_batches()[0]
    writer.write(batch.slice(0, 4))
    first = writer.prepare_commit(1)
    writer.write(batch.slice(4))
    second = writer.prepare_commit(2)
    assert checks.read_ids(str(tmp_path / "out")).num_rows == 0  # staged, not visible
    committer.commit(first)
    assert checks.read_ids(str(tmp_path / "out")).column("id").to_pylist() == [0, 1, 2, 3]
    committer.commit(first + second)  # a retry with the older committable again: idempotent
    assert sorted(checks.read_ids(str(tmp_path / "out")).column("id").to_pylist()) == list(range(10))


def _load_script(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A benchmark script loaded by path; the sys.path entries it adds, and its neighbours it imports by bare
    name, are gone after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    mod = _load(name)
    for neighbour in ("_common", "_checks", "cpu", "kafka_ceiling"):
        if neighbour not in before:
            sys.modules.pop(neighbour, None)
    return mod


def test_the_checkpoint_overhead_reference_is_the_generators_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _load_script("checkpoint_overhead", monkeypatch)
    rows = checks.generator_rows(bench.SPLITS, 1000, bench.KEYS)
    sums = rows.group_by("key").aggregate([("value", "sum")]).sort_by("key")
    assert bench.expected_sums(4000).tolist() == sums.column("value_sum").to_pylist()


def test_the_table_sinks_reference_is_its_messages_below_the_end_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _load_script("table_sinks", monkeypatch)
    ends = {0: 3, 1: 2, 2: 2, 3: 0}  # message i is offset i // 4 of partition i % 4
    got = bench.expected_rows(20, ends).to_pylist()
    want = [json.loads(bench.value(i)) for i in range(20) if i // 4 < ends[i % 4]]
    assert got == want and [r["id"] for r in got] == [0, 1, 2, 4, 5, 6, 8]
