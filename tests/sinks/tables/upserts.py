"""Upserts under test: random change streams, a reference written apart from the code under test (a dict
the changes are applied to one by one, in source order), and a driver that stages, collapses and merges a
checkpoint's changes into a Delta or Iceberg table as the upsert sink does."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from sluice.sink import CommitOutcome
from sluice.sinks.delta.upsert import DeltaUpsert
from sluice.sinks.iceberg.upsert import IcebergUpsert
from sluice.sinks.tables.changes import (
    OP,
    ORDER,
    Op,
    change_table,
    collapse,
    delete_staged,
    read_staged,
    stage_changes,
)
from sluice.sinks.tables.files import TableFile, data_file_name
from sluice.sinks.tables.storage import arrow_filesystem, delta_options, iceberg_io_options

from tests.sinks.tables.helpers import Target

ROW_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64())])


@dataclass(frozen=True)
class Change:
    key: int
    op: Op
    name: str | None
    amount: float | None
    order: int


def random_stream(rng: random.Random, n: int, keys: int, start_order: int = 0, first_key: int = 0) -> list[Change]:
    """``n`` changes of keys ``first_key..first_key+keys-1`` in source order: inserts, updates, deletes and snapshot reads,
    several per key (deletes carry only the key, as Debezium's default replica identity does)."""
    out = []
    for i in range(n):
        op = rng.choice([Op.INSERT, Op.UPDATE, Op.UPDATE, Op.DELETE, Op.READ])
        k = first_key + rng.randrange(keys)
        if op is Op.DELETE:
            out.append(Change(k, op, None, None, start_order + i))
        else:
            out.append(Change(k, op, f"n{k}-{i}", round(rng.uniform(0, 1000), 2), start_order + i))
    return out


def apply_in_order(state: dict[int, tuple[str | None, float | None]], changes: Iterable[Change]) -> None:
    """The reference: each change applied to a dict, one after another, in source order."""
    for c in sorted(changes, key=lambda c: c.order):
        if c.op is Op.DELETE:
            state.pop(c.key, None)
        else:
            state[c.key] = (c.name, c.amount)


def as_table(changes: Sequence[Change]) -> pa.Table:
    rows = pa.table(
        {
            "id": pa.array([c.key for c in changes], pa.int64()),
            "name": pa.array([c.name for c in changes], pa.string()),
            "amount": pa.array([c.amount for c in changes], pa.float64()),
        }
    )
    return change_table(rows, [int(c.op) for c in changes], [c.order for c in changes])


def table_state(table: pa.Table) -> dict[int, tuple[str | None, float | None]]:
    """A table read back as ``{id: (name, amount)}``; fails on a duplicated key."""
    if table.num_rows == 0:
        return {}
    ids, names, amounts = (table.column(c).to_pylist() for c in ("id", "name", "amount"))
    assert len(set(ids)) == len(ids), f"{len(ids) - len(set(ids))} duplicated key(s) in the table"
    return {i: (n, a) for i, n, a in zip(ids, names, amounts, strict=True)}


@dataclass
class Upserts:
    """A Delta or Iceberg upsert target driven as the sink does: writers stage collapsed changes at
    pre-commit, the global commit reads them back, merges once, deletes them."""

    target: Target
    keys: tuple[str, ...] = ("id",)
    job_id: str = "job"
    schema_mode: str = "strict"
    partition_by: tuple[str, ...] = ()
    staged: list[TableFile] = field(default_factory=list)
    _seq: int = 0

    def __post_init__(self) -> None:
        self.engine = self.make_engine()

    @property
    def table_uri(self) -> str:
        return f"{self.target.root}/table" if self.target.kind == "delta" else f"{self.target.root}/warehouse/db/events"

    def make_engine(self, **kw: Any) -> DeltaUpsert | IcebergUpsert:
        if self.target.kind == "delta":
            path = f"{self.target.root}/table"
            return DeltaUpsert(
                path,
                self.keys,
                f"sluice-{self.job_id}-sink",
                delta_options(path, self.target.storage_options),
                schema_mode=self.schema_mode,
                partition_by=self.partition_by,
                **kw,
            )
        return IcebergUpsert(
            self.load_iceberg,
            self.keys,
            self.job_id,
            "sink",
            storage_options=self.target.storage_options,
            schema_mode=self.schema_mode,
            **kw,
        )

    def catalog(self) -> Any:
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog(
            "sluice",
            uri=f"sqlite:///{self.target.catalog_dir}/catalog.db",
            warehouse=f"{self.target.root}/warehouse",
            **iceberg_io_options(self.target.storage_options),
        )

    def load_iceberg(self, schema: pa.Schema | None) -> Any:
        from pyiceberg.exceptions import NoSuchTableError
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.schema import assign_fresh_schema_ids
        from pyiceberg.transforms import IdentityTransform

        catalog = self.catalog()
        try:
            return catalog.load_table("db.events")
        except NoSuchTableError:
            if schema is None:
                return None
        catalog.create_namespace_if_not_exists("db")
        iceberg = assign_fresh_schema_ids(catalog._convert_schema_if_needed(schema))
        spec = PartitionSpec(
            *(
                PartitionField(iceberg.find_field(c).field_id, 1000 + i, IdentityTransform(), c)
                for i, c in enumerate(self.partition_by)
            )
        )
        return catalog.create_table("db.events", schema=iceberg, partition_spec=spec)

    # -- the sink's steps ---------------------------------------------------------------------------------
    def fs(self) -> tuple[Any, str]:
        return arrow_filesystem(self.table_uri, self.target.storage_options)

    def stage(self, checkpoint_id: int, changes: pa.Table, subtask: int = 0) -> TableFile:
        """A writer's pre-commit: its changes collapsed and staged."""
        fs, root = self.fs()
        name = data_file_name(self.job_id, checkpoint_id, subtask, 0, self._seq, "0123456789ab")
        self._seq += 1
        f = stage_changes(fs, root, name, collapse(changes, self.keys), checkpoint_id)
        self.staged.append(f)
        return f

    def commit(
        self, checkpoint_id: int, files: Sequence[TableFile], hook: Callable[[str], None] | None = None
    ) -> CommitOutcome:
        """The global commit of a checkpoint: skip what the table has, else read, merge, then clean up."""
        fs, root = self.fs()
        if self.engine.committed() >= checkpoint_id:
            outcome = CommitOutcome.ALREADY_COMMITTED
        else:
            changes = read_staged(fs, root, files, self.keys)
            outcome = self.engine.apply(checkpoint_id, changes, *([hook] if hook else []))
        if outcome is not CommitOutcome.RETRY_LATER:
            delete_staged(fs, root, files)
        return outcome

    def checkpoint(self, checkpoint_id: int, changes: Sequence[Change], subtasks: int = 2) -> CommitOutcome:
        """Stage ``changes`` over ``subtasks`` writers (each gets an arbitrary share, in shuffled arrival
        order: the order column decides) and commit them."""
        rng = random.Random(checkpoint_id)
        shares: list[list[Change]] = [[] for _ in range(subtasks)]
        for c in changes:
            shares[rng.randrange(subtasks)].append(c)
        files = []
        for sub, share in enumerate(shares):
            rng.shuffle(share)
            if share:
                files.append(self.stage(checkpoint_id, as_table(share), sub))
        return self.commit(checkpoint_id, files)

    def state(self) -> dict[int, tuple[str | None, float | None]]:
        return table_state(self.target.read())


__all__ = ["OP", "ORDER", "ROW_SCHEMA", "Change", "Upserts", "apply_in_order", "as_table", "random_stream", "table_state"]
