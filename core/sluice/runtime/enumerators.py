"""The split enumerators of an attempt's sources, on the driver (Flink's ``SourceCoordinator``).

Each source vertex has one enumerator: created from the restored checkpoint's enumerator state, started
with the splits the restored readers held handed back, told of every reader, polled for new splits every
``discovery_interval``, and asked for splits by readers. Its assignments go to the source subtasks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sluice.graph import JobGraph, JobVertex, SubtaskId
from sluice.runtime.restore import RestoredCheckpoint
from sluice.source import Source, SourceSplit

__all__ = ["SourceEnumerators"]


class SourceEnumerators:
    """The enumerators of one attempt, by source uid; every call into them holds ``lock``.

    Args:
        job: The job.
        attempt: The attempt's number (0: the run starts).
        remote: The handle of a subtask (splits are assigned through it).
        lock: Guards the enumerators (shared with the checkpoint coordinator, which snapshots them).
        done: Set when the attempt ends (polling stops).
        on_error: Called with an error of an enumerator's poll (it fails the attempt).
    """

    def __init__(
        self,
        job: JobGraph,
        attempt: int,
        remote: Callable[[SubtaskId], Any],
        lock: threading.RLock,
        done: threading.Event,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.job = job
        self.attempt = attempt
        self.remote = remote
        self.lock = lock
        self.done = done
        self.on_error = on_error
        #: the enumerators, by source uid
        self.enumerators: dict[str, Any] = {}
        self._ctx: dict[int, _EnumeratorCtx] = {}
        self._poll_thread: threading.Thread | None = None

    def _sources(self) -> list[JobVertex]:
        return [v for v in self.job.vertices.values() if v.is_source]

    def create(self, restored: RestoredCheckpoint | None) -> set[SubtaskId]:
        """Create every source's enumerator (from its restored state); returns the source subtasks."""
        source_tasks: set[SubtaskId] = set()
        for v in self._sources():
            node = v.chain[0]
            src: Source = node.spec
            ctx = _EnumeratorCtx(self, v)
            self._ctx[v.id] = ctx
            state = restored.enumerator_state(node.uid, src.enumerator_state_serializer()) if restored else None
            self.enumerators[node.uid] = src.create_enumerator(ctx, state)
            source_tasks.update(SubtaskId(v.id, i) for i in range(v.parallelism))
        return source_tasks

    def start(self, restored: RestoredCheckpoint | None) -> None:
        """Start the enumerators: splits the restored readers held go back, every reader registers."""
        with self.lock:
            for v in self._sources():
                enum = self.enumerators[v.chain[0].uid]
                enum.start()
                if restored is not None:
                    splits = restored.reader_splits(v.chain[0].uid, v.chain[0].spec.split_serializer())
                    if splits:
                        enum.add_splits_back(splits)
                for i in range(v.parallelism):
                    self._ctx[v.id].registered.append(i)
                    enum.add_reader(i)

    def start_polling(self) -> None:
        """Poll each source's enumerator every ``discovery_interval`` until the attempt ends."""
        self._poll_thread = threading.Thread(target=self._poll, name="enumerators", daemon=True)
        self._poll_thread.start()

    def _poll(self) -> None:
        last: dict[str, float] = {}
        while not self.done.is_set():
            for v in self._sources():
                node = v.chain[0]
                interval = node.spec.discovery_interval
                if interval is None:
                    continue
                now = time.monotonic()
                if now - last.get(node.name, now - interval - 1) >= interval:
                    last[node.name] = now
                    try:
                        with self.lock:
                            self.enumerators[node.uid].poll()
                    except Exception as exc:
                        self.on_error(exc)
            self.done.wait(0.05)

    def request_split(self, task: SubtaskId) -> None:
        """Reader ``task`` asks for a split."""
        with self.lock:
            v = self.job.vertices[task.vertex]
            self.enumerators[v.chain[0].uid].handle_split_request(task.index)


class _EnumeratorCtx:
    """EnumeratorContext: routes assignments to the source subtasks of one vertex."""

    def __init__(self, sources: SourceEnumerators, vertex: JobVertex) -> None:
        self._a = sources
        self._v = vertex
        self.registered: list[int] = []

    @property
    def parallelism(self) -> int:
        return self._v.parallelism

    @property
    def attempt(self) -> int:
        """The attempt's number (0: the run starts; a source resolves run-wide bounds then)."""
        return self._a.attempt

    def assign_splits(self, assignment: dict[int, list[SourceSplit]]) -> None:
        for i, splits in assignment.items():
            if splits:
                self._a.remote(SubtaskId(self._v.id, i)).assign_splits(splits)

    def signal_no_more_splits(self, subtask: int) -> None:
        self._a.remote(SubtaskId(self._v.id, subtask)).no_more_splits()

    def registered_readers(self) -> list[int]:
        return list(self.registered)
