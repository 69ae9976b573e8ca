"""The in-process runtime: every subtask a thread, channels are in-memory queues with the same credit rules.

For tests and quick runs without a JVM (``runtime="local"``). An attempt ends only once its tasks' threads
ended (each task thread and its checkpoint upload thread; bounded by ``JobConfig.task_cancellation_timeout``),
so a failed attempt writes nothing after the next one started, as Flink restarts only once its tasks reached
a terminal state.
"""

from __future__ import annotations

import logging
import threading
import time

from sluice.graph import ExecutionGraph, SubtaskId
from sluice.runtime.assembly import build_task
from sluice.runtime.attempt import AttemptCancelled, JobAttempt
from sluice.runtime.channels import InputChannel, LocalChannel, OutputChannel, Signal
from sluice.runtime.fault_hook import FaultHook
from sluice.runtime.task import Task

__all__ = ["LocalRuntime", "join_tasks"]

log = logging.getLogger("sluice.job")


class LocalRuntime:
    """Runs attempts of a job in this process. ``cancel()`` stops the current attempt for good."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.current: JobAttempt | None = None

    def cancel(self) -> None:
        self.cancelled.set()
        if self.current is not None:
            self.current.done.set()

    def run_attempt(self, a: JobAttempt, faults: FaultHook) -> None:
        self.current = a
        job = a.job
        eg = ExecutionGraph(job)
        credits = a.cfg.buffers_per_channel
        signals = {s: Signal() for s in eg.subtasks()}
        inputs: dict[SubtaskId, list[InputChannel]] = {s: [] for s in signals}
        input_edges: dict[SubtaskId, list[int]] = {s: [] for s in signals}
        outputs: dict[SubtaskId, dict[int, list[OutputChannel]]] = {s: {} for s in signals}
        for v in job.vertices.values():
            for e in v.inputs:
                down = job.vertices[e.downstream]
                up = job.vertices[e.upstream]
                out_idx = up.outputs.index(e)
                per_sender: dict[int, dict[int, LocalChannel]] = {}
                for s, r in eg.channels_of(e):
                    sender, receiver = SubtaskId(up.id, s), SubtaskId(down.id, r)
                    ch = LocalChannel(signals[receiver], credits=credits, output_capacity=credits)
                    ch.sender_wakeup = signals[sender].notify
                    inputs[receiver].append(ch)
                    input_edges[receiver].append(e.input_index)
                    per_sender.setdefault(s, {})[r] = ch
                for s, by_receiver in per_sender.items():
                    outputs[SubtaskId(up.id, s)][out_idx] = [by_receiver[r] for r in sorted(by_receiver)]
        tasks: list[Task] = []
        try:
            for v in job.vertices.values():
                for i in range(v.parallelism):
                    sid = SubtaskId(v.id, i)
                    t = build_task(
                        job,
                        v,
                        i,
                        inputs[sid],
                        input_edges[sid],
                        outputs[sid],
                        signals[sid],
                        a,
                        a.storage,
                        a.cfg,
                        a.attempt,
                        a.restored,
                        faults,
                    )
                    a.register(sid, t)
                    tasks.append(t)
            a.start_control()
        except BaseException:
            for t in tasks:
                t.cancel()  # never started: what their operators hold (keyed state backends) is released now
            raise
        for t in tasks:
            t.start()
        a.done.wait()
        if self.cancelled.is_set() and a.failure is None:
            a.failure = AttemptCancelled("cancelled")
        if a.failure is not None:
            for t in tasks:
                t.cancel()
        join_tasks(tasks, a.cfg.task_cancellation_timeout, f"attempt {a.attempt}")


def join_tasks(tasks: list[Task], timeout: float, what: str) -> bool:
    """Wait up to ``timeout`` seconds in all for ``tasks``' threads (task and upload threads) to end; a
    warning names those still running then. True if all ended."""
    deadline = time.monotonic() + timeout
    alive: list[str] = []
    for t in tasks:
        if not t.join(max(0.0, deadline - time.monotonic())):
            alive.extend(t.alive_threads())
    if alive:
        log.warning(
            "%s: thread(s) %s did not end within %.0fs (JobConfig.task_cancellation_timeout); not waited for "
            "any longer", what, ", ".join(alive), timeout,
        )  # fmt: skip
    return not alive
