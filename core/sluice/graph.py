"""Logical graph (what the API builds) -> job graph (operator chains) -> execution graph (subtasks, channels).

Forward edges between nodes of equal parallelism are chained into one task, so their batches pass by
function call. Every other edge becomes an exchange: hash (key groups), rebalance or broadcast.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.errors import ConfigError, GraphError
from sluice.keys import KeySelector

__all__ = [
    "ExecutionGraph",
    "JobEdge",
    "JobGraph",
    "JobVertex",
    "LogicalEdge",
    "LogicalGraph",
    "LogicalNode",
    "NodeKind",
    "Partitioning",
    "build_job_graph",
]


class NodeKind(enum.Enum):
    SOURCE = "source"
    OPERATOR = "operator"
    SINK = "sink"


class Partitioning(enum.Enum):
    AUTO = "auto"  # forward if parallelism matches, else rebalance
    FORWARD = "forward"
    HASH = "hash"
    REBALANCE = "rebalance"
    BROADCAST = "broadcast"


@dataclass
class LogicalEdge:
    """``upstream`` (a node id; ``tag`` selects one of its side outputs) feeds this node."""

    upstream: int
    partitioning: Partitioning = Partitioning.AUTO
    key: KeySelector | None = None
    tag: str | None = None
    #: never unaligned: what travels here must have arrived when the checkpoint completes (a sink's writer
    #: stage -> its compactor/committer stage)
    aligned: bool = False


@dataclass
class LogicalNode:
    """An operator as the user declared it. ``factory()`` makes one operator instance per subtask."""

    id: int
    name: str
    kind: NodeKind
    factory: Callable[[], Any]
    parallelism: int | None = None
    inputs: list[LogicalEdge] = field(default_factory=list)
    #: the Source or Sink object, for enumerators, committers and validation
    spec: Any = None
    key: KeySelector | None = None
    #: how operator state of old subtasks is spread on restore: "round_robin" or "union"
    state_distribution: str = "round_robin"
    #: set by ``Stream.uid()`` / ``uid=``: the state identity, kept when the node is renamed
    explicit_uid: str | None = None
    #: the settings the node's state depends on (window size, horizon, bounds, key columns), recorded in
    #: every checkpoint and compared at restore (:mod:`sluice.runtime.upgrades`); None: none to compare
    state_config: dict[str, Any] | None = None

    @property
    def uid(self) -> str:
        """Identity of this node's state in checkpoints: the explicit uid, else the name (Flink's uid)."""
        return self.explicit_uid or self.name


@dataclass
class LogicalGraph:
    nodes: dict[int, LogicalNode] = field(default_factory=dict)
    max_parallelism: int = 128
    default_parallelism: int = 1

    def add(self, node: LogicalNode) -> LogicalNode:
        self.nodes[node.id] = node
        return node

    def set_uid(self, node: LogicalNode, uid: str) -> None:
        """Name ``node``'s state in checkpoints (``Stream.uid``); ConfigError / GraphError if ``uid`` is
        empty or another node's."""
        if not isinstance(uid, str) or not uid.strip():
            raise ConfigError(f"uid: must be a non-empty string (got {uid!r})")
        taken = {n.uid: n.name for n in self.nodes.values() if n is not node}
        if uid in taken:
            raise GraphError(f"uid {uid!r} is already used by operator {taken[uid]!r}: uids must be unique")
        node.explicit_uid = uid

    def parallelism_of(self, node: LogicalNode) -> int:
        return node.parallelism or self.default_parallelism

    def validate(self) -> list[int]:
        """Check the graph and return node ids in topological order. Raises GraphError."""
        if not any(n.kind is NodeKind.SINK for n in self.nodes.values()):
            raise GraphError("the pipeline has no sink: connect a stream with stream.sink(...)")
        names: dict[str, int] = {}
        uids: dict[str, str] = {}
        for n in self.nodes.values():
            if n.name in names:
                raise GraphError(
                    f"two operators are named {n.name!r}: names identify state, make them unique"
                )
            names[n.name] = n.id
            if n.uid in uids:
                raise GraphError(
                    f"operators {uids[n.uid]!r} and {n.name!r} have the same uid {n.uid!r}: uids identify "
                    "state in checkpoints, make them unique"
                )
            uids[n.uid] = n.name
            p = self.parallelism_of(n)
            if p < 1:
                raise GraphError(f"operator {n.name!r}: parallelism must be >= 1 (got {p})")
            if p > self.max_parallelism:
                raise GraphError(
                    f"operator {n.name!r}: parallelism {p} is above max_parallelism {self.max_parallelism}; "
                    "lower it or raise the pipeline's max_parallelism"
                )
            for e in n.inputs:
                if e.upstream not in self.nodes:
                    raise GraphError(f"operator {n.name!r} reads a stream that is not part of this pipeline")
                up = self.nodes[e.upstream]
                if up.kind is NodeKind.SINK:
                    raise GraphError(f"operator {n.name!r} reads from sink {up.name!r}: sinks have no output")
                if e.partitioning is Partitioning.FORWARD and self.parallelism_of(up) != p:
                    raise GraphError(
                        f"forward edge {up.name!r} -> {n.name!r} needs equal parallelism "
                        f"({self.parallelism_of(up)} != {p}); use rebalance()"
                    )
        consumed = {(e.upstream, e.tag) for n in self.nodes.values() for e in n.inputs}
        for n in self.nodes.values():
            for tag in getattr(n.spec, "side_outputs", ()) if n.kind is NodeKind.SOURCE else ():
                if (n.id, tag) not in consumed:
                    raise GraphError(
                        f"source {n.name!r} emits side output {tag!r} but nothing reads it: connect "
                        f"stream.side_output({tag!r}).sink(...) so those records are not lost"
                    )
        order: list[int] = []
        state: dict[int, int] = {}  # 1 = visiting, 2 = done

        def visit(nid: int, path: list[str]) -> None:
            if state.get(nid) == 2:
                return
            if state.get(nid) == 1:
                raise GraphError(f"the graph has a cycle: {' -> '.join([*path, self.nodes[nid].name])}")
            state[nid] = 1
            for e in self.nodes[nid].inputs:
                visit(e.upstream, [*path, self.nodes[nid].name])
            state[nid] = 2
            order.append(nid)

        for nid in sorted(self.nodes):
            visit(nid, [])
        return order


@dataclass
class JobEdge:
    """An exchange between two vertices."""

    upstream: int  # vertex id
    downstream: int  # vertex id
    partitioning: Partitioning
    key: KeySelector | None
    #: (node id in the upstream chain, side-output tag or None for the main output)
    producer: tuple[int, str | None]
    #: index of this edge among the downstream vertex's inputs
    input_index: int = 0
    #: never unaligned (see LogicalEdge.aligned)
    aligned: bool = False

    @property
    def unaligned_ok(self) -> bool:
        """Barriers may overtake data here: not forward or broadcast (ARCHITECTURE.md 4), not aligned-only."""
        return not self.aligned and self.partitioning not in (Partitioning.FORWARD, Partitioning.BROADCAST)


@dataclass
class JobVertex:
    """A chain of nodes that runs as one task per subtask."""

    id: int
    chain: list[LogicalNode]
    parallelism: int
    inputs: list[JobEdge] = field(default_factory=list)
    outputs: list[JobEdge] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " -> ".join(n.name for n in self.chain)

    @property
    def uid(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.chain[0].uid)

    @property
    def is_source(self) -> bool:
        return self.chain[0].kind is NodeKind.SOURCE


@dataclass
class JobGraph:
    vertices: dict[int, JobVertex]
    logical: LogicalGraph

    @property
    def max_parallelism(self) -> int:
        return self.logical.max_parallelism

    def vertex_of(self, node_id: int) -> JobVertex:
        for v in self.vertices.values():
            if any(n.id == node_id for n in v.chain):
                return v
        raise KeyError(node_id)

    @property
    def num_slots(self) -> int:
        """Slots needed with slot sharing: the largest parallelism."""
        return max(v.parallelism for v in self.vertices.values())

    def describe(self) -> str:
        lines = []
        for v in self.vertices.values():
            ins = ", ".join(
                f"{self.vertices[e.upstream].chain[-1].name}[{e.partitioning.value}]" for e in v.inputs
            )
            lines.append(f"  [{v.id}] {v.name}  x{v.parallelism}" + (f"  <- {ins}" if ins else ""))
        return "\n".join(lines)


def _resolve(graph: LogicalGraph, node: LogicalNode, e: LogicalEdge) -> Partitioning:
    if e.partitioning is not Partitioning.AUTO:
        return e.partitioning
    same = graph.parallelism_of(graph.nodes[e.upstream]) == graph.parallelism_of(node)
    return Partitioning.FORWARD if same else Partitioning.REBALANCE


def build_job_graph(graph: LogicalGraph) -> JobGraph:
    """Validate ``graph`` and chain it into a job graph."""
    order = graph.validate()
    consumers: dict[int, list[tuple[LogicalNode, LogicalEdge]]] = {nid: [] for nid in graph.nodes}
    for n in graph.nodes.values():
        for e in n.inputs:
            consumers[e.upstream].append((n, e))

    def chains_into(n: LogicalNode) -> int | None:
        """The upstream node ``n`` is chained after, or None."""
        if len(n.inputs) != 1:
            return None
        e = n.inputs[0]
        if e.tag is not None or _resolve(graph, n, e) is not Partitioning.FORWARD:
            return None
        main_consumers = [c for c, ce in consumers[e.upstream] if ce.tag is None]
        return e.upstream if len(main_consumers) == 1 else None

    vertex_of: dict[int, int] = {}
    vertices: dict[int, JobVertex] = {}
    for nid in order:
        n = graph.nodes[nid]
        up = chains_into(n)
        if up is not None:
            v = vertices[vertex_of[up]]
            v.chain.append(n)
        else:
            v = JobVertex(id=len(vertices), chain=[n], parallelism=graph.parallelism_of(n))
            vertices[v.id] = v
        vertex_of[nid] = v.id
    for nid in order:
        n = graph.nodes[nid]
        v = vertices[vertex_of[nid]]
        if v.chain[0].id != nid:
            continue
        for e in n.inputs:
            je = JobEdge(
                upstream=vertex_of[e.upstream],
                downstream=v.id,
                partitioning=_resolve(graph, n, e),
                key=e.key,
                producer=(e.upstream, e.tag),
                input_index=len(v.inputs),
                aligned=e.aligned,
            )
            v.inputs.append(je)
            vertices[je.upstream].outputs.append(je)
    return JobGraph(vertices=vertices, logical=graph)


@dataclass(frozen=True)
class SubtaskId:
    vertex: int
    index: int

    def __str__(self) -> str:
        return f"{self.vertex}.{self.index}"


@dataclass
class ExecutionGraph:
    """Subtasks and the channels between them: for an edge, the channel list per (sender, receiver)."""

    job: JobGraph

    def channels_of(self, edge: JobEdge) -> list[tuple[int, int]]:
        """(sender subtask, receiver subtask) pairs of ``edge``, in the receiver's input-gate order."""
        up = self.job.vertices[edge.upstream].parallelism
        down = self.job.vertices[edge.downstream].parallelism
        if edge.partitioning is Partitioning.FORWARD:
            return [(i, i) for i in range(down)]
        return [(s, r) for r in range(down) for s in range(up)]

    def subtasks(self) -> list[SubtaskId]:
        return [SubtaskId(v.id, i) for v in self.job.vertices.values() for i in range(v.parallelism)]
