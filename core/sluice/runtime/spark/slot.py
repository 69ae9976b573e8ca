"""What runs inside one Spark barrier task: a *slot* hosting subtask i of every vertex with parallelism > i.

A slot connects to the driver's control server, tells it where its data plane listens, learns its peers'
addresses from the driver (:class:`~sluice.runtime.spark.messages.Peers`), links to every other slot
(:class:`~sluice.runtime.spark.transport.DataPlane`), loads the checkpoint to restore from storage itself,
builds its subtasks (LocalChannel between subtasks in the slot, remote channels across slots), registers
them, and starts them when the driver says so. It stops when the driver says stop (success) or cancel, or
when it loses the driver or a peer; a failure makes the Spark task fail, which fails the stage.

Root cause first: before it stops, a slot tells the driver why (:mod:`~sluice.runtime.spark.messages`):
a subtask's error (TaskFailed), or its own failure (SlotFailed), marked as a consequence when another
failure caused it (a lost peer). Its last message is a Goodbye; the driver takes a connection that ends
without one for a lost slot.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import sluice.runtime.spark.messages as m
import sluice.runtime.spark.rpc as rpc
from sluice.checkpoint.storage_loader import storage_for
from sluice.graph import SubtaskId
from sluice.runtime.assembly import build_task
from sluice.runtime.channels import InputChannel, LocalChannel, OutputChannel, Signal
from sluice.runtime.fault_hook import NO_FAULTS
from sluice.runtime.local import join_tasks
from sluice.runtime.restore import RestoredCheckpoint
from sluice.runtime.spark.cluster import bind_address
from sluice.runtime.spark.slot_reports import SlotError, SlotGateway, SlotLogHandler, portable
from sluice.runtime.spark.slot_spec import SlotSpec, channel_plan
from sluice.runtime.spark.transport import DataPlane
from sluice.runtime.task import Task

__all__ = ["SlotError", "SlotSpec", "run_slot", "slot_function"]

log = logging.getLogger("sluice.spark.slot")


class Slot:
    """One slot of one attempt (see the module docstring)."""

    def __init__(self, spec: SlotSpec, index: int) -> None:
        self.spec = spec
        self.index = index
        self.tasks: dict[SubtaskId, Task] = {}
        self._finished: set[SubtaskId] = set()
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._peers: list[tuple[str, int]] | None = None
        self._peers_known = threading.Event()
        self._end = threading.Event()
        self._stop_ok = False
        self._failure: BaseException | None = None
        self._ctl: rpc.MessageConnection | None = None
        self._levels: dict[str, int] = {}

    # -- messaging -----------------------------------------------------------------------------------
    def send(self, msg: m.SlotMessage) -> None:
        if self._ctl is not None:
            self._ctl.send(msg)

    def fail(self, error: BaseException, *, report: bool = False, consequence: bool = True) -> None:
        """Stop the slot with ``error`` (what its Spark task raises) unless it already failed or stopped.

        Args:
            error: why the slot stops.
            report: tell the driver (SlotFailed); False when a report was sent already (TaskFailed), the
                driver caused the stop (Cancel), or the driver is unreachable.
            consequence: the failure was caused by another one (e.g. a peer that stopped).
        """
        with self._lock:
            first = self._failure is None and not self._stop_ok
            if first:
                self._failure = error
        if first and report:
            self.send(m.SlotFailed(self.spec.attempt, self.index, portable(error, self.index), consequence))
        self._end.set()
        self._started.set()
        self._peers_known.set()

    def task_finished(self, task: SubtaskId) -> None:
        with self._lock:
            self._finished.add(task)

    def metrics_of(self, task: SubtaskId) -> dict[str, int]:
        t = self.tasks.get(task)
        out: dict[str, int] = {}
        for ctx in t.contexts if t is not None else []:
            for k, v in dict(ctx.metrics).items():  # a copy: the task thread may add keys meanwhile
                out[k] = out.get(k, 0) + v
        return out

    def metrics_message(self, task: SubtaskId) -> m.Metrics:
        """The counters and the built-in metrics snapshot of ``task`` now."""
        t = self.tasks.get(task)
        snap = t.metrics_snapshot() if t is not None else None
        return m.Metrics(self.spec.attempt, task, self.metrics_of(task), snap or {})

    def _report_metrics(self) -> None:
        """Every ``metrics_interval`` seconds, send each subtask's metrics to the driver (until the end)."""
        interval = self.spec.metrics_interval
        while interval > 0 and not self._end.wait(interval):
            for sid in list(self.tasks):
                self.send(self.metrics_message(sid))

    def subtask_of_thread(self, thread_name: str) -> str | None:
        # task threads are "task-<vertex>.<index>", upload threads "upload-<vertex>.<index>"
        for prefix in ("task-", "upload-"):
            if thread_name.startswith(prefix):
                key = thread_name[len(prefix) :].split("_", 1)[0]
                for sid, t in self.tasks.items():
                    if str(sid) == key:
                        return t.name
        return None

    def _on_control(self, msg: m.Message) -> None:
        match msg:
            case m.Peers(addresses=addresses):
                self._peers = [(str(h), int(p)) for h, p in addresses]
                self._peers_known.set()
            case m.Start(log_levels=levels):
                self._levels = levels
                self._started.set()
            case m.Stop():
                self._stop_ok = True
                self._end.set()
                self._started.set()
                self._peers_known.set()
            case m.Cancel():
                self.fail(SlotError(f"slot {self.index} was cancelled by the driver"))
            case m.TriggerCheckpoint(task=task, barrier=barrier):
                self._task(task, lambda t: t.trigger_checkpoint(barrier))
            case m.CheckpointComplete(task=task, checkpoint_id=cid):
                self._task(task, lambda t: t.notify_checkpoint_complete(cid))
            case m.CheckpointAborted(task=task, checkpoint_id=cid):
                self._task(task, lambda t: t.notify_checkpoint_aborted(cid))
            case m.AssignSplits(task=task, splits=splits):
                self._task(task, lambda t: t.assign_splits(splits))
            case m.NoMoreSplits(task=task):
                self._task(task, lambda t: t.no_more_splits())
            case _:
                raise m.ProtocolError(f"a slot does not handle {type(msg).__name__}")

    def _task(self, task: SubtaskId, call: Callable[[Task], None]) -> None:
        t = self.tasks.get(task)
        if t is not None:
            call(t)

    def _on_driver_closed(self, error: BaseException | None) -> None:
        if not self._stop_ok:
            self.fail(SlotError(f"slot {self.index} lost its connection to the driver: {error}"))

    def _on_peer_lost(self, peer: int, error: BaseException) -> None:
        with self._lock:
            all_done = len(self._finished) == len(self.tasks) > 0
        if not all_done:
            lost = SlotError(f"slot {self.index} lost its link to slot {peer}: {error}")
            self.fail(lost, report=True, consequence=True)

    # -- lifecycle -----------------------------------------------------------------------------------
    def run(self, host: str) -> dict[str, Any]:
        """Run the slot to its end; raises SlotError (failing the Spark task) unless stopped by the driver."""
        spec = self.spec
        host = spec.host or host
        plane = DataPlane(
            self.index, spec.slots, spec.secret, spec.tls, bind_address(host), self._on_peer_lost
        )
        try:
            sock = rpc.connect(spec.driver[0], spec.driver[1], spec.secret, spec.tls, spec.connect_timeout)
        except BaseException:
            plane.close(orderly=False)
            raise
        self._ctl = rpc.MessageConnection(
            sock, self._on_control, self._on_driver_closed, f"slot-{self.index}"
        )
        self._ctl.start()
        self.send(m.Hello(spec.attempt, self.index, os.getpid(), (host, plane.port)))
        handler = SlotLogHandler(self)
        root = logging.getLogger()
        saved = (root.level, logging.getLogger("sluice").level)
        root.addHandler(handler)
        try:
            self._set_up(plane)
            subtasks = tuple((sid, t.name) for sid, t in self.tasks.items())
            self.send(m.Registered(spec.attempt, self.index, subtasks))
            self._started.wait()
            if self._end.is_set():
                raise self._failure or SlotError(f"slot {self.index} stopped before it started")
            root.setLevel(self._levels.get("", root.level))
            logging.getLogger("sluice").setLevel(self._levels.get("sluice", logging.NOTSET))
            log.info(
                "slot %d (pid %d) runs %s", self.index, os.getpid(), [t.name for t in self.tasks.values()]
            )
            for t in self.tasks.values():
                t.start()
            threading.Thread(
                target=self._report_metrics, name=f"slot-{self.index}-metrics", daemon=True
            ).start()
            self._end.wait()
            if self._failure is not None:
                raise self._failure
            return {"slot": self.index, "pid": os.getpid(), "tasks": len(self.tasks)}
        finally:
            ok = self._failure is None and self._stop_ok
            for t in self.tasks.values():
                if not ok:
                    t.cancel()
            # before the Spark task ends: a failed attempt's threads (upload threads too) write nothing after
            # the next attempt started, even in a Python worker that Spark reuses
            join_tasks(list(self.tasks.values()), spec.cfg.task_cancellation_timeout, f"slot {self.index}")
            for sid in self.tasks:
                if sid not in self._finished:
                    self.send(self.metrics_message(sid))
            root.removeHandler(handler)
            root.setLevel(saved[0])
            logging.getLogger("sluice").setLevel(saved[1])
            plane.close(orderly=ok)
            self.send(m.Goodbye(spec.attempt, self.index))
            self._ctl.close(flush_timeout=2.0)

    def _set_up(self, plane: DataPlane) -> None:
        """Reach the peers, then build the subtasks; a failure is reported to the driver before it is raised."""
        timeout = self.spec.connect_timeout
        if not self._peers_known.wait(timeout):
            self._raise(
                SlotError(f"slot {self.index} did not learn its peers within {timeout:.0f}s"), None, True
            )
        if self._end.is_set():
            raise self._failure or SlotError(f"slot {self.index} stopped before it started")
        assert self._peers is not None
        try:
            plane.connect(self._peers, timeout)
        except Exception as exc:
            # a peer that failed first makes its link fail here
            self._raise(SlotError(f"slot {self.index} could not reach its peers: {exc}"), exc, True)
        try:
            self._build(plane)
        except BaseException as exc:
            self._raise(exc, None, False)

    def _raise(self, error: BaseException, cause: BaseException | None, consequence: bool) -> NoReturn:
        self.fail(error, report=True, consequence=consequence)
        if cause is not None:
            raise error from cause
        raise error

    def _build(self, plane: DataPlane) -> None:
        spec = self.spec
        job, cfg = spec.job, spec.cfg
        mine = {SubtaskId(v.id, self.index) for v in job.vertices.values() if v.parallelism > self.index}
        credits = cfg.buffers_per_channel
        signals = {s: Signal() for s in mine}
        inputs: dict[SubtaskId, list[InputChannel]] = {s: [] for s in mine}
        input_edges: dict[SubtaskId, list[int]] = {s: [] for s in mine}
        per_sender: dict[tuple[SubtaskId, int], dict[int, OutputChannel]] = {}
        for cid, snd, rcv, out_idx, in_idx in channel_plan(job):
            if snd not in mine and rcv not in mine:
                continue
            if snd in mine and rcv in mine:
                ch = LocalChannel(signals[rcv], credits=credits, output_capacity=credits)
                ch.sender_wakeup = signals[snd].notify
                inputs[rcv].append(ch)
                input_edges[rcv].append(in_idx)
                per_sender.setdefault((snd, out_idx), {})[rcv.index] = ch
            elif rcv in mine:
                inputs[rcv].append(plane.input_channel(snd.index, cid, signals[rcv]))
                input_edges[rcv].append(in_idx)
            else:
                out = plane.output_channel(rcv.index, cid, credits)
                out.sender_wakeup = signals[snd].notify
                per_sender.setdefault((snd, out_idx), {})[rcv.index] = out
        outputs: dict[SubtaskId, dict[int, list[OutputChannel]]] = {s: {} for s in mine}
        for (snd, out_idx), by_receiver in per_sender.items():
            outputs[snd][out_idx] = [by_receiver[r] for r in sorted(by_receiver)]
        storage = storage_for(cfg.checkpoint, cfg.job_id)
        restored = None
        if spec.restore_path is not None:
            key = cfg.checkpoint.resolved_key()
            restored = RestoredCheckpoint.load(storage, spec.restore_path, spec.drop_channel_state, key=key)
        bound = spec.faults.in_slot(self.index, self._report_crash) if spec.faults is not None else None
        faults = bound or NO_FAULTS
        gateway = SlotGateway(self)
        for v in job.vertices.values():
            sid = SubtaskId(v.id, self.index)
            if sid not in mine:
                continue
            self.tasks[sid] = build_task(
                job,
                v,
                self.index,
                inputs[sid],
                input_edges[sid],
                outputs[sid],
                signals[sid],
                gateway,
                storage,
                cfg,
                spec.attempt,
                restored,
                faults,
            )

    def _report_crash(self, desc: str) -> None:
        if self._ctl is not None:
            self._ctl.send_sync(m.FaultFired(self.spec.attempt, self.index, desc), timeout=1.0)


def run_slot(spec: SlotSpec, index: int, host: str) -> dict[str, Any]:
    """Run slot ``index`` of ``spec`` (outside Spark too, e.g. in tests).

    The slot listens where ``spec.host`` (else ``host``, the executor's address) reaches it and tells its
    peers that address, through the driver."""
    return Slot(spec, index).run(host)


def slot_function(spec: SlotSpec) -> Callable[[Iterator[Any]], Iterator[dict[str, Any]]]:
    """The function of the barrier stage's ``mapPartitions``: one call per slot."""

    def run(_: Iterator[Any]) -> Iterator[dict[str, Any]]:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        me = ctx.partitionId()
        host = ctx.getTaskInfos()[me].address.rsplit(":", 1)[0]
        yield run_slot(spec, me, host)

    return run
