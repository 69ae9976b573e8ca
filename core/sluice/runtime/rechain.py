"""Unaligned channel state across a change of chaining (a rescale can chain or unchain operators).

An ``AUTO`` exchange is forward, so chained, only while both sides have the same parallelism: restoring at
another parallelism can merge two old vertices into one chain (a join at parallelism 3 feeding its sink at 1,
restored at 1) or split one (restored at 3). Channel state names inputs by index and output writers by
position, both relative to the old chain, so it is translated into the node each batch was on its way to:
an old subtask's input state goes to its old head, its output state to the consumer of that writer. A
subtask of the new job takes the in-flight data of the old subtasks whose head is in its chain: batches for a
node in the middle of its chain are processed by that operator (:attr:`TaskRestore.inject`), batches for
its head are replayed as input, batches for another vertex are re-sent on the writer that now leads there.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sluice.checkpoint.channel_state import read_ipc
from sluice.graph import JobGraph, JobVertex, LogicalGraph, Partitioning
from sluice.runtime.partitioners import HashPartitioner
from sluice.runtime.task_spec import TaskRestore

__all__ = ["old_chain", "rechained_channel_state"]


def old_chain(payload: dict[str, Any]) -> list[str]:
    """The node uids of an old subtask's chain, head first (its state file lists them in chain order)."""
    return list(payload["operators"])


def _writer_targets(graph: LogicalGraph, chain: list[str]) -> list[tuple[str, str, int]]:
    """(producer uid, consumer uid, the consumer's input index) of each output writer of a subtask whose chain
    was ``chain``, in the order its output channel state numbers them
    (:func:`sluice.runtime.assembly.build_task`: the vertex's output edges by consumer in topological order,
    grouped by producer)."""
    by_uid = {n.uid: n.id for n in graph.nodes.values()}
    ids = {by_uid[u] for u in chain if u in by_uid}
    groups: dict[tuple[int, str | None], list[tuple[str, str, int]]] = {}
    for nid in graph.validate():
        n = graph.nodes[nid]
        if nid in ids:
            continue
        for i, e in enumerate(n.inputs):
            if e.upstream in ids:
                producer = graph.nodes[e.upstream].uid
                groups.setdefault((e.upstream, e.tag), []).append((producer, n.uid, i))
    return [t for ts in groups.values() for t in ts]


def _new_writers(vertex: JobVertex, job: JobGraph) -> dict[tuple[str, int], int]:
    """(consumer uid, input index) -> the index of the writer of ``vertex`` that leads there."""
    groups: dict[Any, list[tuple[str, int]]] = {}
    for e in vertex.outputs:
        groups.setdefault(e.producer, []).append((job.vertices[e.downstream].chain[0].uid, e.input_index))
    return {t: i for i, t in enumerate(t for ts in groups.values() for t in ts)}


def rechained_channel_state(
    job: JobGraph, vertex: JobVertex, index: int, olds: list[tuple[int, dict[str, Any]]], r: TaskRestore
) -> None:
    """Fill ``r`` with the in-flight data of ``olds`` (old subtask index, state payload): the old subtasks
    with a node in ``vertex``'s chain, some of which had another chain. This chain takes the input state of
    those whose head is in it, and the output state its nodes produced."""
    chain = [n.uid for n in vertex.chain]
    writers = _new_writers(vertex, job)
    p = vertex.parallelism
    # (0: input state, 1: output state; chain position; input index; batch)
    inject: list[tuple[int, int, int, pa.RecordBatch]] = []
    for old_index, payload in olds:
        mine = old_index % p == index
        head = old_chain(payload)[0]
        pos = chain.index(head) if head in chain else -1
        for input_index, blob in payload.get("input_state", []) if pos >= 0 else []:
            b = read_ipc(blob)
            if pos > 0:  # the head was fed over the network, now its predecessor feeds it in the chain
                if mine:
                    inject.append((0, pos, input_index, b))
                continue
            edge = next(e for e in vertex.inputs if e.input_index == input_index)
            if edge.partitioning is Partitioning.HASH and edge.key is not None:
                part = HashPartitioner(edge.key, job.max_parallelism)
                r.replay_input.extend((input_index, x) for i, x in part.partition(b, p) if i == index)
            elif mine:
                r.replay_input.append((input_index, b))
        if not mine:
            continue
        targets = _writer_targets(job.logical, old_chain(payload))
        for w, blob in payload.get("output_state", []):
            producer, node, input_index = targets[w]
            if producer not in chain:
                continue
            b = read_ipc(blob)
            if node in chain:  # the consumer is chained now: it takes the batches after its own input state
                inject.append((1, chain.index(node), input_index, b))
            else:
                r.resend_output.append((writers[node, input_index], b))
    # the operator furthest down the chain first: its in-flight data is older than what comes from upstream
    inject.sort(key=lambda x: (-x[1], x[0]))
    r.inject.extend((pos, input_index, b) for _, pos, input_index, b in inject)
