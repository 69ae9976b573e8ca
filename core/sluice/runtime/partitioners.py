"""How a batch is spread over the subtasks of the next vertex: forward, hash (key groups), rebalance, broadcast."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import pyarrow as pa

from sluice.keys import KeySelector
from sluice.state.keygroups import key_groups, subtask_for_key_groups

__all__ = [
    "BroadcastPartitioner",
    "ForwardPartitioner",
    "HashPartitioner",
    "Partitioner",
    "RebalancePartitioner",
]


class Partitioner(ABC):
    """Splits a batch into (channel index, part) pairs."""

    #: whether the exchange may carry unaligned (persisted) channel state that can be redistributed
    supports_unaligned = True

    @abstractmethod
    def partition(self, batch: pa.RecordBatch, num_channels: int) -> list[tuple[int, pa.RecordBatch]]: ...


class ForwardPartitioner(Partitioner):
    """One-to-one: subtask i sends to subtask i (its only channel)."""

    supports_unaligned = False

    def partition(self, batch: pa.RecordBatch, num_channels: int) -> list[tuple[int, pa.RecordBatch]]:
        return [(0, batch)]


class BroadcastPartitioner(Partitioner):
    """Every batch to every channel."""

    supports_unaligned = False

    def partition(self, batch: pa.RecordBatch, num_channels: int) -> list[tuple[int, pa.RecordBatch]]:
        return [(i, batch) for i in range(num_channels)]


class RebalancePartitioner(Partitioner):
    """Round-robin whole batches over the channels."""

    def __init__(self, start: int = 0) -> None:
        self._next = start

    def partition(self, batch: pa.RecordBatch, num_channels: int) -> list[tuple[int, pa.RecordBatch]]:
        i = self._next % num_channels
        self._next += 1
        return [(i, batch)]


class HashPartitioner(Partitioner):
    """Rows go to the subtask owning their key group: key -> stable hash -> key group -> subtask."""

    def __init__(self, key: KeySelector, max_parallelism: int) -> None:
        self.key = key
        self.max_parallelism = max_parallelism

    def partition(self, batch: pa.RecordBatch, num_channels: int) -> list[tuple[int, pa.RecordBatch]]:
        if batch.num_rows == 0:
            return []
        targets = subtask_for_key_groups(
            key_groups(self.key.hashes(batch), self.max_parallelism), self.max_parallelism, num_channels
        )
        if num_channels == 1 or (targets == targets[0]).all():
            return [(int(targets[0]), batch)]
        order = np.argsort(targets, kind="stable")
        sorted_targets = targets[order]
        bounds = np.flatnonzero(np.diff(sorted_targets)) + 1
        out = []
        for chunk in np.split(order, bounds):
            out.append((int(targets[chunk[0]]), batch.take(pa.array(chunk))))
        return out
