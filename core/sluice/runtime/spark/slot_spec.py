"""What a slot is given: :class:`SlotSpec`, shipped in the Spark task closure, and the job's channel plan
that every slot computes alike."""

from __future__ import annotations

from dataclasses import dataclass, field

import sluice.runtime.spark.rpc as rpc
from sluice.config.job import JobConfig
from sluice.graph import ExecutionGraph, JobGraph, SubtaskId
from sluice.runtime.fault_hook import FaultHook

__all__ = ["SlotSpec", "channel_plan"]


@dataclass(frozen=True)
class SlotSpec:
    """Everything a slot needs, shipped in the Spark task closure (the job secret included: Spark's own
    RPC carries it, so turn on ``spark.authenticate``/``spark.network.crypto.enabled`` on shared clusters)."""

    job: JobGraph
    cfg: JobConfig
    attempt: int
    slots: int
    driver: tuple[str, int]
    secret: bytes = field(repr=False)
    tls: rpc.TlsConfig | None
    #: the address a slot advertises to its peers (local mode: loopback); None: the host Spark ran it on
    host: str | None
    restore_path: str | None
    drop_channel_state: bool
    #: the fault hook of this attempt (tests), bound in each slot with ``in_slot``
    faults: FaultHook | None = None
    connect_timeout: float = 120.0
    #: seconds between the slot's metrics reports to the driver (Metrics messages); 0 = only at the end
    metrics_interval: float = 1.0


def channel_plan(job: JobGraph) -> list[tuple[int, SubtaskId, SubtaskId, int, int]]:
    """Every channel of the job as (channel id, sender, receiver, output index, input edge index), in
    the order the in-process runtime creates them (the receiver's input-gate order). Every slot computes
    the same list, so channel ids agree without talking."""
    eg = ExecutionGraph(job)
    out: list[tuple[int, SubtaskId, SubtaskId, int, int]] = []
    for v in job.vertices.values():
        for e in v.inputs:
            up = job.vertices[e.upstream]
            out_idx = up.outputs.index(e)
            for s, r in eg.channels_of(e):
                out.append((len(out), SubtaskId(up.id, s), SubtaskId(v.id, r), out_idx, e.input_index))
    return out
