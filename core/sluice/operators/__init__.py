"""Operators: what a task runs, one instance per subtask (``sluice.operators``).

* :mod:`~sluice.operators.base` - the contract: :class:`~sluice.operators.base.Operator`, its context, its
  collector, the snapshot it takes at a checkpoint;
* :mod:`~sluice.operators.stateless` - pass-through, map_batches, filter, map, flat_map;
* :mod:`~sluice.operators.keyed` - keyed process functions with keyed state and timers in the job's state
  backend (:meth:`OperatorContext.create_keyed_backend`), reduce;
* :mod:`~sluice.operators.sinks` - the operators of a two-phase-commit sink (writer, committer, compactor
  stage) and how ``Stream.sink`` expands into them; :mod:`~sluice.operators.committables` - commits with
  retries, and how committables and writer state are stored.

* :mod:`~sluice.operators.dedup` - deduplication within a horizon (keep the first, or the last by a column);
  :mod:`~sluice.operators.joins` - the enrichment (latest row per key) and interval joins, two-input
  operators; :mod:`~sluice.operators.batchwise` - their helpers over whole batches.

Stateful operators to come go beside them, one module per family: windows (``operators/windows.py``:
Arrow partial aggregates per key group, key and window, fired by the watermark through the keyed backend's
timers). Like deduplication and the joins, each is keyed, working on whole
batches with batch-wise state access (ARCHITECTURE.md section 4b): ``ctx.create_keyed_backend(uid)`` in
``setup``, ``backend.key_batch(columns)`` and ``backend.batch_state(descriptor)`` per batch, the backend's
snapshot as ``OperatorSnapshot(keyed=...)``, its restore in ``initialize_state``, checkpoint notifications
forwarded, ``dispose`` in ``close`` (``KeyedProcessOperator`` is the example). An operator module imports the
contract, state and the checkpoint snapshot type; never the runtime (``sluice.runtime`` runs operators).
"""

from sluice.operators.base import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    Collector,
    Operator,
    OperatorContext,
    OperatorSnapshot,
)
from sluice.operators.keyed import KeyedProcessOperator, ReduceFunction
from sluice.operators.stateless import (
    FilterOperator,
    FlatMapOperator,
    MapBatchesOperator,
    MapOperator,
    PassThroughOperator,
)

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "Collector",
    "FilterOperator",
    "FlatMapOperator",
    "KeyedProcessOperator",
    "MapBatchesOperator",
    "MapOperator",
    "Operator",
    "OperatorContext",
    "OperatorSnapshot",
    "PassThroughOperator",
    "ReduceFunction",
]
