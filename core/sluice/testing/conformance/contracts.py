"""What the conformance kit checks, how it reports a broken contract, and how it compares records.

Every failed check raises :class:`ConformanceError` (an ``AssertionError``, so pytest shows it as a failed
test) whose message starts with the contract's name in brackets, says what happened and what the contract
asks for: ``[source: reader restore at checkpointed positions] 4 record(s) emitted twice ...``.

Records are compared as multisets of rows restricted to the case's identifying columns: a record missing,
emitted twice or not expected at all is named with a few examples.
"""

from __future__ import annotations

import collections
import contextlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sluice.errors import SluiceError
from sluice.serializers import SimpleVersionedSerializer

__all__ = [
    "SINK_CONTRACTS",
    "SOURCE_CONTRACTS",
    "ConformanceError",
    "RecordDiff",
    "attributed",
    "diff_records",
    "row_counts",
    "through_serializer",
]

#: the source contracts, by the short name the checks use
SOURCE_CONTRACTS = {
    "split_once": "every split read exactly once",
    "enumerator_restore": "enumerator restore",
    "reader_restore": "reader restore at checkpointed positions",
    "rescale": "rescale up and down",
    "reassignment": "split re-assignment after a failed reader",
    "bounded_end": "bounded end of input",
    "stop_position": "no record after the stopping position",
    "assignment": "splits go to registered readers, one owner each",
    "snapshot": "snapshots name only owned splits and assigned splits pickle",
    "serializers": "splits and enumerator state round-trip through the source's serializers",
    "in_job": "exactly once in a job with a crash",
}

#: the sink contracts, by the short name the checks use
SINK_CONTRACTS = {
    "invisible": "nothing visible before commit",
    "publish": "commit makes the checkpoint's data visible",
    "idempotent": "commit idempotent when repeated",
    "outcome": "commit reports a CommitOutcome",
    "recover": "recover after a crash",
    "abort": "abort of uncommitted data",
    "global_once": "one global commit per checkpoint",
    "serializers": "committables and writer state round-trip through the sink's serializers",
    "in_job": "exactly once in a job with a crash",
}


class ConformanceError(SluiceError, AssertionError):
    """A connector broke a contract of its SPI.

    Attributes:
        contract: the contract's name (a value of :data:`SOURCE_CONTRACTS` or :data:`SINK_CONTRACTS`).
    """

    def __init__(self, kind: str, contract: str, message: str) -> None:
        self.contract = contract
        super().__init__(f"[{kind}: {contract}] {message}")


@contextlib.contextmanager
def attributed(kind: str, contract: str, when: str, others: bool = True) -> Iterator[None]:
    """Report what goes wrong inside as a breach of ``contract``: an exception the connector raised, and
    (if ``others``) a breach of another contract the harness saw on the way, with its message."""
    try:
        yield
    except ConformanceError as exc:
        if exc.contract == contract or not others:
            raise
        raise ConformanceError(kind, contract, f"{when}: {exc}") from exc
    except Exception as exc:
        raise ConformanceError(
            kind, contract, f"{when}: the connector raised {type(exc).__name__}: {exc}"
        ) from exc


def through_serializer(
    serializer: SimpleVersionedSerializer[Any], value: Any, what: str, fail: Callable[[str], ConformanceError]
) -> Any:
    """``value`` after the trip into a checkpoint and back: ``deserialize(version, serialize(value))``.

    What comes back must equal ``value``, or at least serialize to the same bytes (for values without
    ``==`` nor attributes to compare); anything else is reported through ``fail`` (a ConformanceError of
    the caller's contract).
    """
    name = type(serializer).__name__
    try:
        version = serializer.version
        data = serializer.serialize(value)
    except Exception as exc:
        raise fail(f"{name} cannot serialize {what}: {type(exc).__name__}: {exc}") from exc
    if type(version) is not int or not isinstance(data, bytes):
        raise fail(f"{name}: version must be an int and serialize() must return bytes (got "
                   f"{type(version).__name__}, {type(data).__name__})")
    try:
        back = serializer.deserialize(version, data)
    except Exception as exc:
        raise fail(f"{name} cannot read back {what} it wrote: {type(exc).__name__}: {exc}") from exc
    try:
        same = _same(back, value) or (_no_eq(value) and serializer.serialize(back) == data)
    except Exception:
        same = False
    if not same:
        raise fail(
            f"{what} does not survive {name}: {value!r} came back as {back!r} (a restore would resume from "
            "something else than what was checkpointed)"
        )
    return back


def _same(a: Any, b: Any) -> bool:
    """Equal, or (for objects without their own ``==``) of one type with equal contents."""
    if a == b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return not _has_eq(a) and hasattr(a, "__dict__") and _same(vars(a), vars(b))


def _has_eq(value: Any) -> bool:
    """Whether ``value``'s class (or a base other than ``object``) defines ``==``."""
    return any("__eq__" in vars(c) for c in type(value).__mro__[:-1])


def _no_eq(value: Any) -> bool:
    """An object with neither its own ``==`` nor a ``__dict__`` (only its bytes can be compared)."""
    return not _has_eq(value) and not hasattr(value, "__dict__")


def _canonical(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=repr)


def row_counts(
    batches: Iterable[pa.RecordBatch | pa.Table], columns: Sequence[str] | None
) -> collections.Counter[str]:
    """How often each row (restricted to ``columns``, all columns if None) occurs in ``batches``."""
    counts: collections.Counter[str] = collections.Counter()
    for b in batches:
        if b.num_rows == 0:
            continue
        if columns is not None:
            missing = [c for c in columns if c not in b.schema.names]
            if missing:
                raise ConformanceError(
                    "records",
                    "records carry their identifying columns",
                    f"a batch has no column(s) {missing} (its columns: {b.schema.names}); set the case's "
                    "columns to ones every emitted batch has",
                )
            b = b.select(list(columns))
        counts.update(_canonical(r) for r in b.to_pylist())
    return counts


@dataclass
class RecordDiff:
    """How the records got differ from the records expected."""

    expected: int
    got: int
    missing: list[str]
    duplicated: list[str]
    unexpected: list[str]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.unexpected)

    def describe(self, limit: int = 3) -> str:
        """One line: what is missing, duplicated or unexpected, with up to ``limit`` examples each."""
        parts = []
        for what, rows in (
            ("never emitted", self.missing),
            ("emitted more than once", self.duplicated),
            ("not among the expected records", self.unexpected),
        ):
            if rows:
                parts.append(f"{len(rows)} record(s) {what} (e.g. {', '.join(rows[:limit])})")
        return f"of {self.expected} expected record(s) the connector produced {self.got}: " + "; ".join(parts)


def diff_records(expected: collections.Counter[str], got: collections.Counter[str]) -> RecordDiff:
    """Compare two row multisets (from :func:`row_counts`)."""
    missing: list[str] = []
    duplicated: list[str] = []
    unexpected: list[str] = []
    for row, n in got.items():
        want = expected.get(row, 0)
        if want == 0:
            unexpected.extend([row] * n)
        elif n > want:
            duplicated.extend([row] * (n - want))
    for row, want in expected.items():
        n = got.get(row, 0)
        if n < want:
            missing.extend([row] * (want - n))
    return RecordDiff(
        sum(expected.values()), sum(got.values()), sorted(missing), sorted(duplicated), sorted(unexpected)
    )
