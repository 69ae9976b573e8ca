"""What may change between a checkpoint (or savepoint) and the job that restores it: each row of the table in
docs/upgrades.md, carried over, refused in one line naming the operator and the change, or allowed by
``allow_changed_operators``.

The refusals compare the settings each stateful operator's state depends on, which every checkpoint records
(:mod:`sluice.runtime.upgrades`); here a checkpoint holding state of every stateful operator of the old job is
checked against the new job (``RestoredCheckpoint.check_compatible``, as every restore does), and one job
runs end to end: the issue's window size changed between a crash and its restore.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sluice import CheckpointConfig, NoRestart, Pipeline, RestoreError
from sluice.connectors.generator import GeneratorSource
from sluice.functions import KeyedProcessFunction
from sluice.graph import JobGraph
from sluice.runtime.restore import RestoredCheckpoint, _OldTask
from sluice.runtime.upgrades import operator_configs
from sluice.sinks.delta import DeltaSink
from sluice.sinks.testing import TwoPhaseCommitTestSink, read_committed
from sluice.testing.faults import FaultInjector
from sluice.windows import Session, Sliding, Tumbling, count, sum

Build = Callable[[Any], Any]


class _Noop(KeyedProcessFunction):
    def process(self, key: Any, rows: pa.RecordBatch, ctx: Any) -> Any:
        return None


def job_of(build: Build, max_parallelism: int = 128, parallelism: int = 1) -> JobGraph:
    p = Pipeline("upgrade", parallelism=parallelism, max_parallelism=max_parallelism,
                 checkpoint=CheckpointConfig(storage="/nonexistent/chk"))  # fmt: skip
    out = build(p.source(GeneratorSource(num_splits=1, records_per_split=10), name="src"))
    if out is not None:
        out.sink(TwoPhaseCommitTestSink("/nonexistent/out"), name="out")
    return p.build()


def checkpoint_of(job: JobGraph, recorded: bool = True) -> RestoredCheckpoint:
    """A checkpoint of ``job`` whose every stateful operator holds state (``recorded``: with the settings
    this sluice records; False: as an earlier sluice wrote it)."""
    uids = sorted(operator_configs(job))
    meta: dict[str, Any] = {"checkpoint_id": 7, "max_parallelism": job.max_parallelism}
    if recorded:
        meta["operators"] = operator_configs(job)
    payload = {"operators": {uid: {"keyed": None, "operator": {"rows": 1}} for uid in uids}}
    return RestoredCheckpoint(7, "/chk/chk-7", meta, [_OldTask(0, 0, payload)])


def window(assigner: Any, *aggs: Any, key: str = "key", **kw: Any) -> Build:
    return lambda s: s.key_by(key).window(assigner, time="ts", **kw).aggregate(*(aggs or (count(),)), name="w")


def dedup(**kw: Any) -> Build:
    args = {"keys": "key", "within": "10 min", "event_time": "ts", **kw}
    return lambda s: s.deduplicate(**args, name="d")


def latest(**kw: Any) -> Build:
    args = {"on": "key", "event_time": "ts", **kw}
    return lambda s: s.join_latest(s.map_batches(lambda b: b, schema=s.schema, name="table"), **args, name="j")


def interval(between: tuple[Any, Any], on: str = "key") -> Build:
    return lambda s: s.interval_join(s.map_batches(lambda b: b, schema=s.schema, name="other"), on=on,
                                     between=between, event_time="ts", name="i")  # fmt: skip


def process(key: str) -> Build:
    return lambda s: s.key_by(key).process(_Noop(), name="p")


def upsert(**kw: Any) -> Build:
    return lambda s: s.sink(DeltaSink("/nonexistent/table", **kw), name="t")


def retyped(s: Any) -> Any:
    """The stream with its key column ``key`` as a string."""
    schema = s.schema.set(s.schema.get_field_index("key"), pa.field("key", pa.string()))
    return s.map_batches(lambda b: b.set_column(3, "key", pc.cast(b.column("key"), pa.string())), schema=schema,
                         name="m")  # fmt: skip


def keyed_after(build: Build, step: Callable[[Any], Any]) -> Build:
    return lambda s: build(step(s))


def same(s: Any) -> Any:
    return s.map_batches(lambda b: b, schema=s.schema, name="m")


#: (what changes, the old job, the new job, a fragment of the refusal or None where it is carried over)
ROWS: list[tuple[str, Build, Build, str | None]] = [
    ("nothing", window(Tumbling("1 min")), window(Tumbling(60)), None),
    ("window size", window(Tumbling("1 min")), window(Tumbling("2 min")),
     "operator 'w' (uid 'w') changed since the checkpoint: window size 60000 ms -> 120000 ms"),
    ("window offset", window(Tumbling("1 min")), window(Tumbling("1 min", offset="10 s")), "window offset 0 ms -> 10000 ms"),
    ("window slide", window(Sliding("10 min", "1 min")), window(Sliding("10 min", "2 min")), "window slide 60000 ms -> 120000 ms"),
    ("session gap", window(Session("30 s")), window(Session("1 min")), "session gap 30000 ms -> 60000 ms"),
    ("window kind", window(Tumbling("1 min")), window(Sliding("1 min", "30 s")), "window kind tumbling -> sliding"),
    ("aggregations", window(Tumbling("1 min")), window(Tumbling("1 min"), count(), sum("value")),
     'aggregations [["count", null, "count"]] -> [["count", null, "count"], ["sum", "value", "sum_value"]]'),
    ("allowed lateness", window(Tumbling("1 min")), window(Tumbling("1 min"), allowed_lateness="10 s"),
     "allowed_lateness 0 ms -> 10000 ms"),
    ("window key columns", window(Tumbling("1 min")), window(Tumbling("1 min"), key="split"),
     'key columns ["key"] -> ["split"]'),
    ("key column type", keyed_after(window(Tumbling("1 min")), same), keyed_after(window(Tumbling("1 min")), retyped),
     'key column types ["int64"] -> ["string"]'),
    ("dedup within", dedup(), dedup(within="1 h"), "within 600000 ms -> 3600000 ms"),
    ("dedup keep", dedup(), dedup(keep="last", order_by="value"), "keep first -> last; order_by none -> value"),
    ("dedup time", dedup(), dedup(event_time=None), "time event -> processing"),
    ("join_latest time", latest(), latest(event_time=None), "time event -> processing"),
    ("join_latest how", latest(), latest(how="left"), None),
    ("join_latest idle timeout", latest(), latest(table_idle_timeout=None), None),
    ("interval bounds", interval(("-10 s", "10 s")), interval(("0 s", "10 s")), "between lower -10000 ms -> 0 ms"),
    ("interval key", interval(("-10 s", "10 s")), interval(("-10 s", "10 s"), on="split"), 'key columns ["key"] -> ["split"]'),
    ("process key", process("key"), process("split"), 'key columns ["key"] -> ["split"]'),
    ("operator kind under one uid", window(Tumbling("1 min")), lambda s: s.deduplicate("key", within=60, name="w"),
     "operator window -> deduplicate"),
    ("upsert sink key columns", upsert(mode="upsert", key_columns=["key"]), upsert(mode="upsert", key_columns=["id"]),
     'key_columns ["key"] -> ["id"]'),
    ("sink mode", upsert(), upsert(mode="upsert", key_columns=["id"]), "mode append -> upsert"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "old", "new", "refusal"), ROWS, ids=[r[0] for r in ROWS])
def test_each_change_is_carried_over_or_refused_in_one_line(change: str, old: Build, new: Build, refusal: str | None) -> None:
    checkpoint, job = checkpoint_of(job_of(old)), job_of(new)
    if refusal is None:
        checkpoint.check_compatible(job)
        return
    with pytest.raises(RestoreError) as err:
        checkpoint.check_compatible(job)
    text = str(err.value)
    assert refusal in text and "allow_changed_operators=True" in text and "\n" not in text, text
    checkpoint.check_compatible(job, allow_changed_operators=True)  # the explicit flag restores it anyway


def test_parallelism_and_operator_names_with_the_old_uid_are_carried_over() -> None:
    old = job_of(lambda s: s.key_by("key").window(Tumbling(60), time="ts").aggregate(count(), name="w"))
    new = job_of(lambda s: s.key_by("key").window(Tumbling(60), time="ts").aggregate(count(), name="w2").uid("w"),
                 parallelism=3)  # fmt: skip
    checkpoint_of(old).check_compatible(new)


def test_a_removed_operator_and_max_parallelism_are_refused_as_before() -> None:
    old = job_of(window(Tumbling(60)))
    with pytest.raises(RestoreError, match=r"holds state of operator uid\(s\) \['w'\] that this job does not have"):
        checkpoint_of(old).check_compatible(job_of(lambda s: s))
    checkpoint_of(old).check_compatible(job_of(lambda s: s), allow_non_restored_state=True)
    with pytest.raises(RestoreError, match="taken with max_parallelism=128; the job has 64"):
        checkpoint_of(old).check_compatible(job_of(window(Tumbling(60)), max_parallelism=64))


def test_a_checkpoint_of_an_earlier_sluice_is_compared_only_for_the_interval_join() -> None:
    """A checkpoint written before operators' settings were recorded: nothing to compare, except an interval
    join's, whose ``between`` now has Flink's meaning (the mirror image of the earlier one)."""
    checkpoint_of(job_of(window(Tumbling(60))), recorded=False).check_compatible(job_of(window(Tumbling(120))))
    old = checkpoint_of(job_of(interval(("0 s", "10 s"))), recorded=False)
    with pytest.raises(RestoreError) as err:
        old.check_compatible(job_of(interval(("0 s", "10 s"))))
    assert "interval_join 'i' (uid 'i') was written by an earlier sluice" in str(err.value)
    assert "the old (a, b) is (-b, a) now" in str(err.value) and "\n" not in str(err.value)
    old.check_compatible(job_of(interval(("-10 s", "0 s"))), allow_changed_operators=True)


def typed(t: pa.DataType) -> Callable[[Any], Any]:
    """The stream with its key column ``key`` cast to ``t``."""
    def step(s: Any) -> Any:
        schema = s.schema.set(s.schema.get_field_index("key"), pa.field("key", t))
        return s.map_batches(lambda b: b.set_column(3, "key", pc.cast(b.column("key"), t)), schema=schema, name="m")

    return step


@pytest.mark.parametrize("t", [pa.timestamp("ms"), pa.timestamp("ns", "UTC"), pa.date32(), pa.timestamp("us"), pa.int64()], ids=str)
def test_keyed_state_of_keys_whose_key_groups_changed_is_refused_from_an_earlier_sluice(t: pa.DataType) -> None:
    """Timestamp keys of a unit other than microseconds, and date keys, hash as microseconds and days now (a
    key fell in another key group before): a checkpoint that recorded such key types without ``key_hash`` is
    refused in one line; microsecond timestamps and ints hashed as now and are carried over."""
    job = job_of(keyed_after(window(Tumbling("1 min")), typed(t)))
    current = checkpoint_of(job)
    current.check_compatible(job)
    earlier = checkpoint_of(job)
    for config in earlier.metadata["operators"].values():
        config.pop("key_hash", None)
    if t in (pa.timestamp("us"), pa.int64()):
        assert "key_hash" not in operator_configs(job)["w"]
        earlier.check_compatible(job)
        return
    assert operator_configs(job)["w"]["key_hash"] == 2
    with pytest.raises(RestoreError) as err:
        earlier.check_compatible(job)
    assert f"operator 'w' (uid 'w') is keyed by [\"{t}\"] and was written by an earlier sluice" in str(err.value)
    assert "allow_changed_operators=True" in str(err.value) and "\n" not in str(err.value)
    earlier.check_compatible(job, allow_changed_operators=True)


def windows(tmp: Path, size: str) -> Pipeline:
    p = Pipeline("upgrade", parallelism=2, restart=NoRestart(),
                 checkpoint=CheckpointConfig(interval=0.05, storage=str(tmp / "chk")))  # fmt: skip
    src = GeneratorSource(num_splits=2, records_per_split=1500, batch_size=20, rows_per_second=1500, step_ms=100)
    p.source(src).key_by("key").window(Tumbling(size), time="ts").aggregate(count(), name="per-window").sink(
        TwoPhaseCommitTestSink(str(tmp / "out"))
    )
    return p


def test_a_window_size_changed_between_a_crash_and_its_restore_is_refused(tmp_path: Path) -> None:
    """The issue's case: a restore with another window size read the windows in state by the new size, and the
    output held split windows. Now the restore is refused in one line naming the operator and the change;
    ``allow_changed_operators=True`` (``--allow-changed-operators``) restores it anyway."""
    faults = FaultInjector(point="complete_to_commit", after=8)  # a few checkpoints in: windows in state
    with pytest.raises(Exception, match="injected fault"):
        windows(tmp_path, "5 s").run(runtime="local", faults=faults, restore="none")
    assert faults.fired
    with pytest.raises(RestoreError) as err:
        windows(tmp_path, "10 s").run(runtime="local", restore="latest")
    text = str(err.value)
    assert "operator 'per-window' (uid 'per-window') changed since the checkpoint: window size 5000 ms -> 10000 ms" in text
    assert "--allow-changed-operators" in text and "\n" not in text
    result = windows(tmp_path, "10 s").run(runtime="local", restore="latest", allow_changed_operators=True)
    assert result.status == "finished" and read_committed(str(tmp_path / "out")) is not None


def test_run_help_names_the_flag() -> None:
    from click.testing import CliRunner
    from sluice.cli import main

    out = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--allow-changed-operators" in out
