"""Loading a completed checkpoint and spreading its state over the subtasks of a (possibly rescaled) job."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.checkpoint.channel_state import read_ipc
from sluice.checkpoint.codec import from_metadata, open_envelope, read_commit_groups, verify_metadata
from sluice.checkpoint.global_commit import CommitGroups
from sluice.checkpoint.payload import decode_task_state
from sluice.checkpoint.state_files import keyed_is_empty, localize, refs_of
from sluice.checkpoint.storage import METADATA, CheckpointStorage, same_folder
from sluice.errors import RestoreError, SluiceError
from sluice.graph import JobGraph, JobVertex, Partitioning
from sluice.operators.committables import unpack_pending
from sluice.runtime.partitioners import HashPartitioner
from sluice.runtime.rechain import old_chain, rechained_channel_state
from sluice.runtime.task_spec import TaskRestore
from sluice.runtime.upgrades import check_operator_changes
from sluice.serializers import SimpleVersionedSerializer
from sluice.sink import Sink
from sluice.source import SourceSplit
from sluice.state.canonical import handle_range
from sluice.state.keygroups import KeyGroupRange, key_group_range
from sluice.state.shared_registry import SharedRef

__all__ = ["RestoredCheckpoint"]


@dataclass
class _OldTask:
    vertex: int
    index: int
    payload: dict[str, Any]


@dataclass
class RestoredCheckpoint:
    """A completed checkpoint (or savepoint), loaded."""

    checkpoint_id: int
    path: str
    metadata: dict[str, Any]
    tasks: list[_OldTask] = field(default_factory=list)
    drop_channel_state: bool = False
    #: it is not in this job's folder: its keyed state files are read where it is, never reused or deleted
    foreign: bool = False

    @classmethod
    def load(
        cls, storage: CheckpointStorage, path: str, drop_channel_state: bool = False, *, key: bytes
    ) -> RestoredCheckpoint:
        """Load the checkpoint or savepoint at ``path`` (wherever its folder was copied); every file must
        verify with the job's checkpoint ``key`` (:mod:`sluice.checkpoint.codec`,
        :mod:`sluice.checkpoint.payload`) before anything of it is decoded.

        Raises:
            RestoreError: it is not a completed checkpoint, or a file of it is missing, corrupt or not
                signed with ``key`` (named, one line).
        """
        path = path.rstrip("/")
        meta = storage.read_metadata_at(path)
        verify_metadata(meta, key, f"{path}/{METADATA}")
        try:
            rc = cls(int(meta["checkpoint_id"]), path, meta, drop_channel_state=drop_channel_state)
            rc.foreign = not same_folder(path.rsplit("/", 1)[0], storage.job_dir())
            handles = [(task, handle.get("path")) for task, handle in meta["tasks"].items()]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RestoreError(f"{path}/{METADATA} is corrupt (not checkpoint metadata: {exc!r})") from None
        seen: set[str] = set()
        for task, file in handles:
            if not file or file in seen:
                continue
            seen.add(file)
            v, i = (int(x) for x in task.split("."))
            data, where = _read_state(storage, path, file)
            try:
                payload = decode_task_state(data, key, where)
            except SluiceError:
                raise
            except Exception as exc:
                raise RestoreError(
                    f"checkpoint {path}: state file {where} is corrupt ({type(exc).__name__}: {exc})"
                ) from None
            rc.tasks.append(_OldTask(v, i, payload))
        return rc

    @property
    def has_channel_state(self) -> bool:
        return any(t.payload.get("input_state") or t.payload.get("output_state") for t in self.tasks)

    @property
    def recovers_channel_state(self) -> bool:
        """The restore re-sends and replays in-flight data (the same answer for every subtask of the job, on
        every runtime: the subtasks agree on whether ``EndOfChannelState`` comes)."""
        return self.has_channel_state and not self.drop_channel_state

    def state_uids(self) -> set[str]:
        """Uids of the operators this checkpoint holds state for (stateless operators hold none)."""
        uids = {u for u, blob in (self.metadata.get("enumerators") or {}).items() if blob}
        uids |= {u for u, groups in (self.metadata.get("global_committables") or {}).items() if groups}
        for t in self.tasks:
            for uid, st in t.payload["operators"].items():
                if not keyed_is_empty(st.get("keyed")) or not _empty(st.get("operator")):
                    uids.add(uid)
        return uids

    def check_compatible(
        self, job: JobGraph, allow_non_restored_state: bool = False, allow_changed_operators: bool = False
    ) -> None:
        """Refuse restores that would lose or misroute state (docs/upgrades.md).

        State whose operator uid the job no longer has (renamed or removed) fails the restore, naming the
        uids, unless ``allow_non_restored_state`` (then that state is dropped, as in Flink). An operator whose
        state depends on settings that changed (a window's size, a key's columns: :mod:`sluice.runtime.upgrades`)
        fails it, naming the operator and the change, unless ``allow_changed_operators``.
        """
        holding = self.state_uids()
        orphans = sorted(holding - {n.uid for n in job.logical.nodes.values()})
        if orphans and not allow_non_restored_state:
            raise RestoreError(
                f"checkpoint {self.path} holds state of operator uid(s) {orphans} that this job does not "
                "have (renamed or removed?). Give the operators their old uid with .uid(...), or restore "
                "with allow_non_restored_state=True (sluice run --allow-non-restored-state) to drop that state"
            )
        if int(self.metadata.get("max_parallelism", job.max_parallelism)) != job.max_parallelism:
            raise RestoreError(
                f"checkpoint {self.path} was taken with max_parallelism={self.metadata.get('max_parallelism')}; "
                f"the job has {job.max_parallelism}: keyed state cannot be redistributed across that change"
            )
        check_operator_changes(self.path, self.metadata, job, holding, allow_changed_operators)
        if self.drop_channel_state or not self.has_channel_state:
            return
        old_vertices = self.metadata.get("vertices", {})
        for v in job.vertices.values():
            old = old_vertices.get(v.uid)
            if old is None or old.get("parallelism") == v.parallelism or not self._vertex_has_state(v):
                continue
            fixed = [
                p
                for p in old.get("inputs", [])
                if p in (Partitioning.FORWARD.value, Partitioning.BROADCAST.value)
            ]
            if fixed:
                raise RestoreError(
                    f"checkpoint {self.checkpoint_id} holds in-flight data (unaligned channel state) of "
                    f"{v.name!r}, which reads a {fixed[0]} exchange: that data cannot be redistributed from "
                    f"parallelism {old.get('parallelism')} to {v.parallelism}. Restore at parallelism "
                    f"{old.get('parallelism')}, or pass recover_without_channel_state={self.checkpoint_id} "
                    "(this loses that in-flight data)"
                )

    def _vertex_has_state(self, v: JobVertex) -> bool:
        names = {n.uid for n in v.chain}
        return any(
            (t.payload.get("input_state") or t.payload.get("output_state"))
            and names & set(t.payload["operators"])
            for t in self.tasks
        )

    def _tasks_of(self, node_name: str) -> list[_OldTask]:
        return sorted((t for t in self.tasks if node_name in t.payload["operators"]), key=lambda t: t.index)

    def for_subtask(self, job: JobGraph, vertex: JobVertex, index: int) -> TaskRestore:
        """The state of subtask ``index`` of ``vertex`` in ``job``, redistributed by key group."""
        r = TaskRestore(self.checkpoint_id, self.recovers_channel_state)
        kgr = key_group_range(job.max_parallelism, vertex.parallelism, index)
        for node in vertex.chain:
            olds = self._tasks_of(node.uid)
            keyed = [self._keyed_handle(node.uid, t) for t in olds]
            r.keyed[node.uid] = [h for h in keyed if h is not None and _overlaps(handle_range(h), kgr)]
            op_states = [t.payload["operators"][node.uid]["operator"] for t in olds]
            if node.state_distribution == "union":
                r.operator[node.uid] = op_states
            else:
                r.operator[node.uid] = [s for j, s in enumerate(op_states) if j % vertex.parallelism == index]
        if not self.drop_channel_state:
            self._channel_state(job, vertex, index, r)
        return r

    def _keyed_handle(self, uid: str, task: _OldTask) -> dict[str, Any] | None:
        """The keyed state handle operator ``uid`` of an old subtask left (paths made absolute when the
        checkpoint is not in this job's folder)."""
        handle = task.payload["operators"][uid].get("keyed")
        if keyed_is_empty(handle):
            return None
        if not isinstance(handle, dict) or "format" not in handle:
            raise RestoreError(
                f"checkpoint {self.path} holds keyed state of {uid!r} in the format of sluice before state "
                "backends (pickled key groups), which this sluice does not restore; start the job without "
                "this checkpoint (--restore none)"
            )
        if self.foreign:
            kind = "savepoint" if self.metadata.get("kind") == "savepoint" else "chk"
            return localize(handle, self.path, f"{kind}-{self.checkpoint_id}")
        return handle

    def shared_refs(self) -> list[SharedRef]:
        """The shared files this checkpoint's keyed state references (as its metadata lists them)."""
        return refs_of(self.metadata.get("tasks", {}).values())

    def _channel_state(self, job: JobGraph, vertex: JobVertex, index: int, r: TaskRestore) -> None:
        # if the rescale chained or unchained operators, the in-flight data moves node by node
        chain = [n.uid for n in vertex.chain]
        olds = sorted((t for t in self.tasks if set(old_chain(t.payload)) & set(chain)), key=lambda t: t.index)
        if any(old_chain(t.payload) != chain for t in olds):
            rechained_channel_state(job, vertex, index, [(t.index, t.payload) for t in olds], r)
            return
        # input channel state: by input edge; hash edges are re-partitioned by key group
        for edge in vertex.inputs:
            batches = [
                read_ipc(b)
                for t in olds
                for e, b in t.payload.get("input_state", [])
                if e == edge.input_index
            ]
            if not batches:
                continue
            if edge.partitioning is Partitioning.HASH and edge.key is not None:
                part = HashPartitioner(edge.key, job.max_parallelism)
                for b in batches:
                    r.replay_input.extend(
                        (edge.input_index, p) for i, p in part.partition(b, vertex.parallelism) if i == index
                    )
            else:
                for t in olds:
                    if t.index % vertex.parallelism == index:
                        r.replay_input.extend(
                            (edge.input_index, read_ipc(b))
                            for e, b in t.payload.get("input_state", [])
                            if e == edge.input_index
                        )
        # output channel state: re-sent by the subtask that inherits the old sender (partitioners route it)
        for t in olds:
            if t.index % vertex.parallelism == index:
                r.resend_output.extend((w, read_ipc(b)) for w, b in t.payload.get("output_state", []))

    def reader_splits(self, node_name: str, serializer: SimpleVersionedSerializer[Any]) -> list[SourceSplit]:
        """The splits (with positions) every reader of source ``node_name`` checkpointed."""
        what = f"checkpoint {self.path}: a split of source {node_name!r}"
        return [
            open_envelope(serializer, env, what)
            for t in self._tasks_of(node_name)
            for env in t.payload.get("splits") or []
        ]

    def enumerator_state(self, node_name: str, serializer: SimpleVersionedSerializer[Any]) -> Any:
        """The enumerator state of source ``node_name``, or None."""
        tree = (self.metadata.get("enumerators") or {}).get(node_name)
        if tree is None:
            return None
        what = f"checkpoint {self.path}: the enumerator state of source {node_name!r}"
        return open_envelope(serializer, from_metadata(tree, what), what)

    def global_committables(self, node_name: str, serializer: SimpleVersionedSerializer[Any]) -> CommitGroups:
        """The committables sink ``node_name``'s global committer must (re)commit, by checkpoint, oldest first."""
        tree = (self.metadata.get("global_committables") or {}).get(node_name)
        what = f"checkpoint {self.path}: the global committables of sink {node_name!r}"
        return read_commit_groups(from_metadata(tree, what), serializer, what) if tree else []

    def sink_committables(self, node_name: str, sink: Sink[Any]) -> list[Any]:
        """Committables of sink ``node_name`` in this checkpoint (per-subtask pending plus global)."""
        out: list[Any] = []
        for t in self._tasks_of(node_name):
            st = t.payload["operators"][node_name]["operator"] or {}
            for _, comms in unpack_pending(sink, st.get("pending"), node_name):
                out.extend(comms)
        for _, comms in self.global_committables(node_name, sink.committable_serializer()):
            out.extend(comms)
        return out


def _read_state(storage: CheckpointStorage, checkpoint: str, file: str) -> tuple[bytes, str]:
    """A task's state file, and where it was read: ``file`` is relative to the checkpoint's folder, so a
    folder restores wherever it was copied."""
    where = f"{checkpoint}/{file}"
    try:
        return storage.retrying("read task state", storage.read_file, where), where
    except FileNotFoundError:
        raise RestoreError(f"checkpoint {checkpoint}: state file {where} is missing") from None


def _overlaps(a: KeyGroupRange, b: KeyGroupRange) -> bool:
    return max(a.start, b.start) < min(a.end, b.end)


def _empty(value: Any) -> bool:
    """Operator state that holds nothing: None, or containers of nothing (e.g. a sink with nothing pending)."""
    if value is None:
        return True
    if isinstance(value, dict):
        return all(_empty(v) for v in value.values())
    if isinstance(value, list | tuple | set):
        return all(_empty(v) for v in value)
    return False
